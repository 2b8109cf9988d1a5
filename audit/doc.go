// Package audit is the closed audit event schema of starlease, its
// validation and redaction guard, and the sinks events are written to.
//
// # Schema
//
// An Event carries exactly the fields the target-lease contract lists for an
// audit event (see Fields) and nothing else: no metadata, no request bodies,
// no lock keys, no backend commands, no credential material, no other
// owner's private fields. The event type is a closed set (EventType). Every
// sink validates an event before writing it (Event.Validate) and refuses
// anything outside the schema, including any string that looks like
// credential material ("star_sk_", "Bearer ", or a run of 64 hex digits):
// the service builds events only from trusted, normalized values, and the
// guard is defence in depth behind that.
//
// # Durability and order
//
// Sink.Write returns only once the event is durable (fsync for FileSink, a
// committed bbolt transaction for BoltSink). The service writes the audit
// event of force-release and revoke (priority high) before it reports
// success, and reports failure if Write fails. Every other request writes
// its event after the operation, whatever the result.
//
// # Volume
//
// Limiter bounds the volume of normal-priority deny and error events so a
// failure flood cannot fill storage: beyond its rate they are counted and
// summarised by one periodic audit_dropped event. High-priority events and
// successful allowed events are never dropped.
package audit
