// Package rabbitmq is the fenced writer for RabbitMQ publications of
// exclusive results (enforcement point 3 of the fenced-write boundary).
//
// A RabbitMQ broker has no fencing guard of its own: it accepts any
// publication from anyone who can connect, and nothing a consumer sees in a
// delivery (headers, message id, redelivered flag) proves who owned the
// target when the message was produced. So a publication never goes to the
// broker straight from leased work. It takes three steps:
//
//  1. Publish (Publisher.Publish). The work hands the message to the lease
//     backend with its commit authorization: AuthorizeCommit with
//     CommitRequest.Outbox set. The backend checks, at its linearization
//     point and by backend time, that the exact lease is still active and
//     unexpired and that its token is not below the sink's high-water mark,
//     and appends the message to its fenced outbox in the SAME atomic
//     operation. An expired, released, force-released, revoked or
//     superseded holder gets lease_lost (or commit_rejected) and its
//     message never enters the outbox. This is the authority: the only
//     place stale-holder exclusion is decided.
//
//  2. Relay (Relay.Run). A relay reads the outbox (lease.Outbox), publishes
//     every entry with publisher confirms, delivery mode persistent, a
//     stable message id (derived from the commit, so a republished entry
//     has the same id), the message's application headers and the fence in
//     headers (HeaderLockKey and the others, set last so they always win;
//     the store refuses application headers under lease.ReservedHeaderPrefix),
//     and removes the entry only after the broker acknowledged it.
//     A nack, a return (with RelayOptions.Mandatory), a confirm timeout, a
//     lost connection or a store error keeps the entry; it is retried with
//     bounded backoff. A poison entry, one the broker refuses for a reason
//     retrying will not cure (its publish closes the channel with 404
//     NOT_FOUND or 403 ACCESS_REFUSED; nacked, or returned, PoisonAttempts
//     times in a row), is moved to the outbox's dead letters
//     (lease.OutboxDeadLetters: kept with its reason, counted, bounded,
//     never deleted by the relay) so it does not stall every later entry;
//     transient failures (a lost connection, a broker that is down) never
//     dead-letter anything. Delivery is at-least-once: a relay that crashes
//     between the broker's ack and OutboxDone publishes the entry again, with
//     the same message id, when it (or another relay) restarts.
//
//  3. Consume (Deduper). Consumers drop duplicates by message id and
//     deliveries whose fencing token is below the highest token they have
//     seen for the lock key. This is defence in depth only, and NOT
//     fencing: it trusts delivery metadata, which anyone able to publish to
//     the exchange can forge, and its memory is bounded. The contract
//     forbids claiming stale-holder exclusion for such a check; the claim
//     rests on step 1 alone. What the Deduper does add is that a consumer
//     processes each accepted publication once (within its window) and never
//     goes backwards to an older holder's result it sees late.
//
// The outbox is the lease backend's own (bolt and valkey both implement
// lease.Outbox), so the publication is as durable as the lease decision that
// accepted it. One relay per outbox is the intended deployment; two relays
// on one outbox are safe but publish duplicates, which consumers drop.
// LeasedRelay keeps it to one: it publishes only while it holds a starlease
// lease on the outbox (RelayIdentity), and `starlease serve
// --rabbitmq-url-file` runs one in every server, so with several servers on
// one backend one publishes and another takes over when it dies. Step 1 is
// also reachable over HTTP: the client's LeaseStore sends CommitRequest.Outbox
// as the outbox object of POST /commits/authorize.
package rabbitmq
