// Package audit is the closed audit event schema of starlease, its
// validation, the redaction of values that may be secrets, and the sinks
// events are written to. A sink on a storage engine lives with that
// engine's package (bolt.AuditSink, valkey.AuditSink), so this package
// imports none; the Filter and read bounds they share are here.
//
// # Schema
//
// An Event carries exactly the fields the target-lease contract lists for an
// audit event (see Fields) and nothing else: no metadata, no request bodies,
// no lock keys, no backend commands, no credential material, no other
// owner's private fields. The event type is a closed set (EventType). Every
// sink validates an event before writing it (Event.Validate) and refuses
// anything outside the schema.
//
// # Redaction
//
// Audit cannot be switched off by input. Any string an event carries may
// have been chosen by a caller (a target id, a correlation, request or
// incident id, an administrator's reason), so a value that may be
// credential material (lease.SecretShaped: "star_sk_", "bearer ", or 64
// hex digits in a row) is replaced, never refused: the service's Redactor,
// keyed by a key derived from the server pepper, writes it as
// "redacted:<128 bits of HMAC-SHA-256 in hex>" — the same form for the same
// value, so events still correlate, and never the value or a plain hash of
// it. Marshal, which every sink encodes with, replaces anything left by
// "redacted" alone. Validate fails only on what this module's own code
// controls (types, codes, consistency), so a caller's choice of identifier
// never suppresses an event or blocks the operation it records; Unmarshal
// refuses a stored event holding credential material, which Marshal never
// writes.
//
// # Durability and order
//
// Sink.Write returns only once the event is durable (fsync for FileSink, a
// committed bbolt transaction for bolt.AuditSink). The service writes the
// audit event of force-release and revoke (priority high) before it
// reports success, and reports failure if Write fails. Every other request
// writes its event after the operation, whatever the result.
//
// # Faults
//
// A sink's fault is never permanent: a failed write leaves nothing behind
// (FileSink cuts the file back to its last whole line; bbolt rolls the
// transaction back), and every later Write tries again. Sinks that can
// tell implement Checker: Check reports the last failure while it lasts
// and probes for recovery, and the service's health (/readyz) is degraded
// while any sink's Check fails.
//
// A backend's audit store that can be unreachable (the Valkey stream) sits
// behind a Spool: an event it cannot take is spooled durably on local disk
// and forwarded later, in order and once each (OnceWriter), so a backend
// outage costs no event.
//
// # Volume
//
// Limiter bounds the volume of normal-priority deny and error events so a
// failure flood cannot fill storage: beyond its rate they are counted and
// summarised by a periodic audit_dropped event. Requests that never
// authenticated (bad keys) have a budget of their own, so a flood of them
// cannot crowd out the events of authenticated callers, and so does each
// authenticated principal (up to a bound, then a shared one; all capped
// together), so one caller cannot hide another's denials; each aggregate
// names its budget in reason, and its principal in principal_id. High-priority
// events and successful allowed events are never dropped. bolt.AuditSink's
// count bound (AuditOptions.MaxEvents) applies to normal-priority events
// only: high-priority events are pruned by age alone.
package audit
