// Package valkey is the production lease backend: the lease-store protocol
// (lease.Store) on a Valkey (or Redis 7) server through
// github.com/valkey-io/valkey-go.
//
// # Atomicity and time
//
// Every transition is one server-side function of a function library
// (library.lua, loaded with FUNCTION LOAD and called with FCALL/FCALL_RO),
// so one atomic section at one backend time: TIME inside the function
// decides expiry, renewal and deadlines; caller clocks never do. Inside a
// mutation the order is that of the reference backend (package bolt):
// backend time, the deadline check, the idempotency lookup first, the
// strict reading of the active record (a key without a TTL, a value that is
// not a canonical v1 record, or a tuple that does not match the requested
// identity fails closed as corrupt and nothing is written), the decision,
// then every write of the transition including its idempotency evidence.
// A key of the identity's layout (or one the transition writes) that holds
// another type fails closed the same way, checked before the first write.
// The Go side validates all input with lease.Prepare* before, and strictly
// decodes every record it receives with lease.DecodeAnyStoredRecord after.
//
// Strict decoding is a pure function of a record's bytes, so both sides
// remember its results by the exact bytes, bounded: the library (up to
// 2048 records, a few MB of the server's Lua memory, lost on restart) for
// records it decoded or wrote (a writer first checks that decoding its
// bytes would give back the same record), and the adapter (2048 records)
// for what DecodeAnyStoredRecord returned. A hit is the decoder's own answer for
// those bytes, and the lock key and tuple are still compared on every
// read; any other bytes are decoded in full.
//
// The library's name and its function names carry a hash of its code, so
// service instances of different builds never call each other's functions
// during a rolling deploy; loading is FUNCTION LOAD without REPLACE and an
// existing library of the same hash is the same code. Stored formats
// change only by a switch in the namespace (ns:format, format.go) that an
// operator throws once every instance reads the new format.
//
// # Key layout
//
// ns is Options.KeyPrefix ("starlease" by default); tag is the lock key's
// suffix after "starintel:target-lease:v1:" (43 base64url characters), used
// as a hash tag so all keys of one identity share one slot:
//
//	ns:{tag}:active         the active record: version 1 (JSON), or version 2 (its lines,
//	                        lease.CompactRecord) once ns:format is "3", or for a lease
//	                        acquired once it is "4", version 3 (lease.EmbeddingRecord:
//	                        version 2 and the acquisition's digest, idempotency scope
//	                        and ttl, its evidence until the lease ends), and once it
//	                        is "6" version 4 instead (lease.LeanRecord: version 3
//	                        without what its own lines derive); read in every
//	                        version; PXAT
//	                        expires_at+ReclaimGrace (for versions 3 and 4 at least
//	                        acquired_at+IdempotencyRetention, so its evidence
//	                        outlives the record even if no reaper runs),
//	                        storage reclamation only: expiry is decided from expires_at
//	ns:{tag}:counter        durable fencing counter; no TTL, never deleted
//	ns:{tag}:idem:<scope>   idempotency evidence; TTL IdempotencyRetention; written as
//	                        version 1, or version 2 (the result's facts, evidence.go)
//	                        once ns:format is "2"; read in either version. In format
//	                        "4" an acquisition's is not written at acquire: every
//	                        ending of its lease writes it from the record (version 2,
//	                        PXAT acquired_at+IdempotencyRetention, not if past); in
//	                        format "5" that and a release's own in version 3, by
//	                        reference to the lease's history entry (lease.
//	                        ReferringEvidence), rewritten in version 2 (TTL kept)
//	                        before the entry is trimmed; in format "7" by
//	                        reference in version 5 instead (lease.LeanIDEvidence:
//	                        what the entry derives left out); in format "8" what
//	                        is written whole (not by reference, or rewritten) is
//	                        version 6 (lease.WholeEvidence: version 2 without the
//	                        tag line, with a check of its key's scope)
//	ns:{tag}:history        terminal evidence, newest first, capped at HistoryPerIdentity,
//	                        in the same version as evidence, read in either version,
//	                        TTL HistoryRetention refreshed on every push; in format
//	                        "5" an entry that evidence refers to is version 4 (version
//	                        2 and the scopes of that evidence, lease.HistoryScopedPrefix);
//	                        in format "8" one that none refers to is version 5
//	                        (version 2 without the tag line, lease.HistoryUntaggedPrefix)
//	ns:{tag}:marks          hash sink → fencing high-water mark; no TTL, never deleted
//	ns:{tag}:cseq           the last commit seq given (orders a lease's commits for
//	                        the sinks); no TTL, never deleted
//	ns:{tag}:commit:<scope> accepted-commit evidence; TTL CommitRetention
//	ns:{tag}:quarantine     the last corruption found for the identity, for operators
//	ns:lease:<lease id>     lease id → tag, for inspect by id; TTL covers the lease's
//	                        maximum lifetime plus HistoryRetention
//	ns:index                List index: one sorted set, score 0, members
//	                        filter ‖ 0 ‖ filter value ‖ lease id ‖ 0 ‖ tag, or for a
//	                        version 3 record filter ‖ 0 ‖ filter value ‖ lease id (List
//	                        reads the tag from ns:lease:<lease id>), so ZRANGEBYLEX over
//	                        a filter's prefix pages in lease-id order; an ending removes
//	                        both forms
//	ns:expiry               expiry schedule (score expires_at) for the reaper;
//	                        one entry per active record (ActiveLeases is its ZCARD):
//	                        tag ‖ 0 ‖ lease id ‖ 0 ‖ token, for every record version
//	ns:outbox               fenced outbox schedule: score the entry's outbox sequence
//	                        (ns:outbox_seq), member message id: exact acceptance order
//	ns:outbox_seq           the last outbox sequence given, incremented by the commit
//	                        function in the lease check's step (and by a dead letter's
//	                        requeue, which goes after every entry); no TTL, never deleted
//	ns:outbox:<message id>  a pending publication (lease.EncodeOutboxEntry's bytes),
//	                        written by the commit function in the lease check's step
//	                        (or by a dead letter's requeue, its bytes), removed by the
//	                        relay after the broker's confirm, or moved to
//	                        ns:outbox_dead_entry:<message id> when dead-lettered (an
//	                        older version left it here: see that key)
//	ns:outbox:bytes         the pending publications' lease.OutboxMessage.Size in all,
//	                        kept by the functions that add and remove them (commit,
//	                        outbox_done, outbox_dead, outbox_requeue); the commit
//	                        function refuses a publication (and outbox_requeue a dead
//	                        letter) past lease.StoreOptions.OutboxMaxBytes (or,
//	                        by ZCARD of ns:outbox, OutboxMaxPending). Absent in a
//	                        namespace written before it: a store counts it when it opens
//	                        (message ids start with "msg_", so none is "bytes")
//	ns:outbox_dead          dead letters: poison publications the relay set aside
//	                        (score backend time, member message id; at most
//	                        lease.MaxOutboxDeadLetters, never expired or trimmed; an
//	                        operator requeues or discards them: outbox_requeue,
//	                        outbox_discard)
//	ns:outbox_dead:<message id>  a dead letter's {"reason","dead_at","own_entry":true}
//	                        (JSON; own_entry last, a suffix the functions test)
//	ns:outbox_dead_entry:<message id>  a dead letter's own entry, moved there by
//	                        outbox_dead (written back by outbox_requeue), so the same
//	                        message id accepted again (its commit evidence expired: a
//	                        message id names no lease) writes ns:outbox:<message id>,
//	                        never the dead letter's entry. A reason without own_entry
//	                        is an older version's dead letter: its entry is
//	                        ns:outbox:<message id>'s unless an entry of that id is
//	                        pending (the key is then that entry's; the dead letter's is
//	                        lost, listed and discarded as lease.DeadLetterEntryMissing,
//	                        never requeued). The mark decides, not this key's
//	                        existence: an older version's discard leaves the key
//	                        behind. One dead letter per message id: set aside again
//	                        while its dead letter waits, the newer replaces the older's
//	                        entry, reason and time, and a warning names the id (bolt
//	                        and etcd keep both, keyed by sequence)
//	ns:cred:<credential id> an API-key credential: exactly auth.EncodeCredential's
//	                        bytes, no TTL (CredentialStore)
//	ns:cred:index           credential List index: sorted set, score 0, member the id
//	ns:audit                audit stream, capped (XADD MAXLEN ~ AuditOptions.MaxLen),
//	                        one field "e" = audit.Marshal's bytes (AuditSink)
//	ns:audit:once:<event id> marker of an event AuditSink.WriteOnce added (a spooled
//	                        event forwarded); TTL a week
//	ns:gate                 the namespace gate: while it exists every lease mutation
//	                        is refused (lease_backend_unavailable) before any other
//	                        read; it holds why (a backup's pause, with a TTL; a restore
//	                        or failover awaiting recovery verification)
//	ns:counter_floor        the recovery epoch's floor: every new token is above it;
//	                        no TTL, never lowered
//	ns:epoch, ns:last_recovery  the recovery epoch and the last recovery's record
//	ns:format               "2" once the namespace is switched to the compact stored
//	                        formats of evidence and history, "3" once active records
//	                        are compact too, "4" once new records carry their
//	                        acquisition's evidence, "5" once endings keep evidence
//	                        by reference, "6" once those records are version 4,
//	                        "7" once evidence by reference is version 5, "8" once
//	                        whole evidence is version 6 (format.go); absent:
//	                        version 1.
//	                        Never lowered or unset.
//
// Every operation on an identity archives an expired active record it
// finds; the reaper (Options.ReapInterval) archives the rest from the
// schedule. Only if no reaper ran for longer than Options.ReclaimGrace
// does a key's TTL remove an expired record first: its expiry is then
// missing from history and its index entries stay behind, skipped by List.
//
// Every key a function touches is passed in KEYS, with one exception;
// nothing is ever found by SCAN or by a client-supplied pattern. The
// exception: an ending of a version 3 record (archive in library.lua)
// writes its acquisition's evidence key, ns:{tag}:idem:<scope>, named from
// the record's stored scope (checked as 43 base64url characters first) and
// the identity's own hash tag, so it is in the slot of the identity's
// declared keys (slot-safe) and can never name another identity's key;
// trimming a history entry of version 4 rewrites the evidence keys it
// names the same way (detach in library.lua). The index, schedule and lease-id
// keys are shared by all identities and written by the same functions, so
// the adapter requires a single-node (non-cluster) primary; Open and Health
// report a cluster or a replica as unsuitable.
//
// # Credentials and audit
//
// The same server and namespace also hold the API-key credentials
// (Store.CredentialStore, or OpenCredentialStore for tools: auth.Store, so
// several servers in front of one Valkey share their keys) and the audit
// stream (Store.AuditSink: audit.Sink). Their atomic steps are two small
// function libraries of their own (credentials.lua, audit.lua),
// content-addressed like the lease library and loaded the same way: create (SET NX plus the index entry)
// and swap (a compare-and-set of a record, optionally creating the
// rotation's new credential) for credentials; add (XADD, the entry id's
// time the event's or, to keep the stream ordered, the newest entry's,
// and the event's marker key set with it: SET PX) and addonce (add unless
// the marker shows the event is there already: EXISTS) for audit. Writes to both are refused while durability is not verified: a
// revocation and an administrator's audit event must survive a crash.
//
// Namespaces sharing a server must not nest (e.g. "starlease" and
// "starlease:cred"): one's keys could be another's.
//
// # Backup, restore and recovery
//
// Store.Backup closes the gate for at most its pause, reads every key of
// the namespace (SCAN, then each key's type, absolute expiry and value),
// and reopens the gate only if it still holds its own closing: the backup
// is a point-in-time snapshot of the whole namespace, and mutations are
// refused (retryably) while it reads. The gate closes lease mutations
// only: a credential issued or revoked during a backup may or may not be
// in it. The audit stream is not carried.
// Store.Restore writes a backup into an empty namespace behind a closed
// gate; Store.Seal closes a promoted replica's namespace. Namespace offers
// these to package recovery (its Backend), and its OpenClosed gives
// recovery the closed namespace (lease.ClosedNamespace):
// its state, and Finish, whose steps (recover_raise, recover_end, reopen)
// run only while the gate is closed. These tools need, beyond the ACL
// below, +scan +pexpiretime +hgetall +zrange +rpush +hset +pexpireat.
//
// # Durability
//
// The fencing counter and idempotency evidence must survive a crash, so the
// server must run with appendonly yes and appendfsync always, and must
// never evict them, so with maxmemory-policy noeviction (the server's
// default: a full server refuses writes instead; required even with
// maxmemory 0, which a CONFIG SET can change without a restart). Open and
// Health check this with CONFIG GET; otherwise Health reports
// lease.HealthUnsuitable and every mutation (including AuthorizeCommit)
// returns lease_backend_unavailable. Managed services that hide CONFIG can
// set Options.AllowUnverifiedDurability after verifying the equivalent
// guarantee out of band.
//
// # Errors
//
// Only *lease.Error leaves this package. A connection that cannot be made
// (nothing was sent) and a server that refuses a command before running it
// (NOPERM, READONLY, OOM, LOADING, …) are lease_backend_unavailable. A
// timeout, reset or closed connection after a mutation was handed to the
// client is lease_outcome_unknown: the function may have committed, and
// LookupRequest (or AuthorizeCommit with the same commit id) resolves it. A
// context already done, or a deadline_at the backend finds passed, is
// deadline_exceeded. Reads never report outcome_unknown.
//
// # Credentials and ACL
//
// The password is read from Options.PasswordFile on every new connection
// (so it can be rotated) and never logged. TLS is used when Options.TLS is
// set, always with certificate verification. A least-privilege ACL for the
// default namespace is:
//
//	user starlease on >PASSWORD resetkeys ~starlease:* resetchannels -@all
//	  +fcall +fcall_ro +function|load +config|get +info +ping +hello
//	  +time +get +set +del +exists +incr +type +pttl +pexpire +lpush +ltrim
//	  +lrange +zadd +zrem +zrangebylex +zrangebyscore +hget +hset
//	  +zcard +xadd +xrevrange +xrange
//
// The first line's commands are the adapter's own (+function|load may be
// dropped if an operator preloads the three libraries); the rest are what
// the functions call, which Valkey checks against the caller's ACL, so the
// key pattern must cover the whole namespace. The last line is for
// ActiveLeases (ZCARD of the schedule) and the audit sink (XADD and
// XREVRANGE and SET in its library, and EXISTS in addonce; XRANGE in
// AuditSink.Read); the credential store
// needs nothing beyond the lines before it (GET, ZRANGEBYLEX, and SET,
// EXISTS, TYPE, ZADD inside its functions). The conformance suites run
// under exactly this ACL (TestConformance, TestCredentialStoreConformance),
// with the password read from a file, as do the audit and ActiveLeases
// tests and the two-server test of the starlease command.
package valkey
