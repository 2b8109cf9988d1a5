// Package client is the Go client of the starlease HTTP API
// (/api/v1/target-leases).
//
// A Client sends one request per call, authenticated with the API key given
// to New as "Authorization: Bearer <key>". It never logs, and its String,
// Format and GoString methods redact the key.
//
// Requests mirror the HTTP bodies of the API: a lock identity travels as
// lock_identity with its seven fields. A mutation (acquire, renew, release,
// force-release, revoke) carries a request_id in its body; an empty
// RequestID is replaced by a fresh "req_<ULID>", which the result (or the
// error) reports so an outcome-unknown answer can be resolved by retrying
// with the same id. The deadline of a call is its context's deadline (or,
// when the context has none, the client's timeout); it is sent as
// X-Request-Timeout-Ms (less a small margin, so the server's answer at its
// deadline arrives before the client gives up) unless the request names its
// own DeadlineAt.
//
// Responses are decoded strictly: one JSON object, no unknown, duplicate or
// case-variant keys, no trailing data, the envelope and code the operation
// answers. Every failure is an *Error carrying the HTTP status, the wire
// code, the message, the offending field of a 400, the correlation id,
// retryability and the retry hint. *Error converts to *lease.Error
// (LeaseError, and errors.As), so lease.CodeOf works on any error a Client
// returns.
//
// Failures without an answer from the server are classified the way the
// lease contract requires:
//
//   - the request was never sent (connection refused, DNS failure):
//     lease_backend_unavailable, or deadline_exceeded if the deadline
//     elapsed first — nothing happened on the server;
//   - the request was sent and no answer could be read (timeout, reset,
//     malformed answer): lease_outcome_unknown for mutations (resolve it by
//     retrying with the same request id), lease_backend_unavailable for
//     reads.
package client
