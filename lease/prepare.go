package lease

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Prepared is a validated, normalized mutation: its canonical identity and
// lock key, idempotency scope key and request digest. Backends act only on
// prepared requests, so every backend validates input the same way.
type Prepared struct {
	Op       Op
	Identity Identity
	LockKey  string
	// Scope is the idempotency key: (operation, lock key, owner principal,
	// request id), hashed to a fixed length.
	Scope string
	// Digest covers every behaviour-affecting input of the operation.
	Digest string
	// Principal is the caller a lookup answers (PrepareLookup only).
	Principal string
}

// fieldHasher builds an unambiguous digest: every field is written as its
// name and length-prefixed value, so no two inputs share an encoding.
type fieldHasher struct{ buf []byte }

func (h *fieldHasher) add(name, value string) *fieldHasher {
	h.buf = binary.AppendUvarint(h.buf, uint64(len(name)))
	h.buf = append(h.buf, name...)
	h.buf = binary.AppendUvarint(h.buf, uint64(len(value)))
	h.buf = append(h.buf, value...)
	return h
}

func (h *fieldHasher) sum() [32]byte { return sha256.Sum256(h.buf) }

func (h *fieldHasher) hex() string { s := h.sum(); return hex.EncodeToString(s[:]) }

func (h *fieldHasher) b64() string { s := h.sum(); return base64.RawURLEncoding.EncodeToString(s[:]) }

func itoa(v int64) string       { return strconv.FormatInt(v, 10) }
func utoa(v uint64) string      { return strconv.FormatUint(v, 10) }
func ms(d time.Duration) string { return itoa(d.Milliseconds()) }

// IdempotencyScope derives the idempotency key of a mutation.
func IdempotencyScope(op Op, lockKey, principalID, requestID string) string {
	h := &fieldHasher{}
	return h.add("op", string(op)).add("lock_key", lockKey).add("principal", principalID).add("request_id", requestID).b64()
}

// AcquisitionScope is the idempotency scope of r's acquisition: its
// owner's request.
func (r *Record) AcquisitionScope() string {
	return IdempotencyScope(OpAcquire, r.LockKey, r.OwnerPrincipalID, r.RequestID)
}

// EvidenceScope is the idempotency scope of the evidence of op that h's
// lease may have: its acquisition's, or for OpRelease the request that
// ended it (ended_by's request_id).
func (h *HistoryEntry) EvidenceScope(op Op) string {
	if op == OpRelease {
		return IdempotencyScope(OpRelease, h.Record.LockKey, h.EndedBy, h.RequestID)
	}
	return h.Record.AcquisitionScope()
}

func (o StoreOptions) identity(raw Identity) (Identity, string, error) {
	return CanonicalLockKey(raw, o.WithDefaults().OperationClasses)
}

func checkMutation(m Mutation) error {
	if err := CheckOpaqueID("request_id", m.RequestID); err != nil {
		return err
	}
	if m.DeadlineAt.IsZero() {
		return Invalid("deadline_at", "a finite deadline is required")
	}
	return CheckOpaqueID("owner_principal_id", m.Caller.PrincipalID)
}

func checkToken(field string, t uint64) error {
	if t < 1 || t > MaxFencingToken {
		return Invalid(field, "must be between 1 and 2^53-1")
	}
	return nil
}

func checkDuration(field string, d, max time.Duration) error {
	if d <= 0 {
		return Invalid(field, "must be positive")
	}
	if d%time.Millisecond != 0 {
		return Invalid(field, "must be whole milliseconds")
	}
	if d > max {
		return Invalid(field, "exceeds the server maximum")
	}
	return nil
}

func prepared(op Op, id Identity, key string, m Mutation, h *fieldHasher) Prepared {
	return Prepared{Op: op, Identity: id, LockKey: key,
		Scope: IdempotencyScope(op, key, m.Caller.PrincipalID, m.RequestID), Digest: h.hex()}
}

// PrepareAcquire validates and normalizes an acquire request.
func PrepareAcquire(req AcquireRequest, o StoreOptions) (AcquireRequest, Prepared, error) {
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, Prepared{}, err
	}
	req.Identity = id
	if err := checkMutation(req.Mutation); err != nil {
		return req, Prepared{}, err
	}
	for _, f := range []struct{ name, v string }{
		{"owner_client_id", req.Caller.ClientID}, {"owner_credential_id", req.Caller.CredentialID},
		{"service_instance_id", req.ServiceInstanceID}, {"execution_id", req.ExecutionID}, {"job_id", req.JobID},
	} {
		if err := CheckOpaqueID(f.name, f.v); err != nil {
			return req, Prepared{}, err
		}
	}
	if req.TraceID != "" {
		if err := CheckOpaqueID("trace_id", req.TraceID); err != nil {
			return req, Prepared{}, err
		}
	}
	if err := checkDuration("ttl_ms", req.TTL, MaxTTL); err != nil {
		return req, Prepared{}, err
	}
	if err := checkDuration("maximum_lifetime_ms", req.MaximumLifetime, MaxLifetime); err != nil {
		return req, Prepared{}, err
	}
	if req.TTL > req.MaximumLifetime {
		return req, Prepared{}, Invalid("ttl_ms", "must not exceed maximum_lifetime_ms")
	}
	if err := ValidateMetadata(req.Metadata); err != nil {
		return req, Prepared{}, err
	}
	h := (&fieldHasher{}).add("op", string(OpAcquire)).add("lock_key", key).
		add("owner_principal_id", req.Caller.PrincipalID).add("owner_client_id", req.Caller.ClientID).
		add("owner_credential_id", req.Caller.CredentialID).add("service_instance_id", req.ServiceInstanceID).
		add("ttl_ms", ms(req.TTL)).add("maximum_lifetime_ms", ms(req.MaximumLifetime)).
		add("execution_id", req.ExecutionID).add("job_id", req.JobID).add("trace_id", req.TraceID).
		add("metadata", string(canonicalMetadata(req.Metadata)))
	return req, prepared(OpAcquire, id, key, req.Mutation, h), nil
}

// PrepareRenew validates and normalizes a renew request.
func PrepareRenew(req RenewRequest, o StoreOptions) (RenewRequest, Prepared, error) {
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, Prepared{}, err
	}
	req.Identity = id
	if err := checkMutation(req.Mutation); err != nil {
		return req, Prepared{}, err
	}
	if err := checkHeld(req.LeaseID, req.FencingToken, req.ServiceInstanceID); err != nil {
		return req, Prepared{}, err
	}
	if req.TTL != 0 {
		if err := checkDuration("ttl_ms", req.TTL, MaxTTL); err != nil {
			return req, Prepared{}, err
		}
	}
	h := (&fieldHasher{}).add("op", string(OpRenew)).add("lock_key", key).
		add("owner_principal_id", req.Caller.PrincipalID).add("lease_id", req.LeaseID).
		add("fencing_token", utoa(req.FencingToken)).add("service_instance_id", req.ServiceInstanceID).
		add("ttl_ms", ms(req.TTL))
	return req, prepared(OpRenew, id, key, req.Mutation, h), nil
}

func checkHeld(leaseID string, token uint64, instance string) error {
	if err := CheckOpaqueID("lease_id", leaseID); err != nil {
		return err
	}
	if err := checkToken("fencing_token", token); err != nil {
		return err
	}
	return CheckOpaqueID("service_instance_id", instance)
}

// PrepareRelease validates and normalizes a release request.
func PrepareRelease(req ReleaseRequest, o StoreOptions) (ReleaseRequest, Prepared, error) {
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, Prepared{}, err
	}
	req.Identity = id
	if err := checkMutation(req.Mutation); err != nil {
		return req, Prepared{}, err
	}
	if err := checkHeld(req.LeaseID, req.FencingToken, req.ServiceInstanceID); err != nil {
		return req, Prepared{}, err
	}
	h := (&fieldHasher{}).add("op", string(OpRelease)).add("lock_key", key).
		add("owner_principal_id", req.Caller.PrincipalID).add("lease_id", req.LeaseID).
		add("fencing_token", utoa(req.FencingToken)).add("service_instance_id", req.ServiceInstanceID)
	return req, prepared(OpRelease, id, key, req.Mutation, h), nil
}

// AdminOutcome is the success code and terminal state of an administrative
// operation: force-release ends a lease released (operational), revoke
// revoked (security).
func AdminOutcome(op Op) (Code, State) {
	if op == OpRevoke {
		return CodeRevoked, StateRevoked
	}
	return CodeForceReleased, StateReleased
}

// PrepareAdmin validates a force-release (OpForceRelease) or revoke (OpRevoke).
func PrepareAdmin(op Op, req AdminRequest, o StoreOptions) (AdminRequest, Prepared, error) {
	if op != OpForceRelease && op != OpRevoke {
		return req, Prepared{}, Invalid("operation", "not an administrative operation")
	}
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, Prepared{}, err
	}
	req.Identity = id
	if err := checkMutation(req.Mutation); err != nil {
		return req, Prepared{}, err
	}
	if err := CheckOpaqueID("lease_id", req.LeaseID); err != nil {
		return req, Prepared{}, err
	}
	if err := checkToken("fencing_token", req.FencingToken); err != nil {
		return req, Prepared{}, err
	}
	if req.Reason == "" && req.IncidentID == "" {
		return req, Prepared{}, Invalid("reason", "a reason or incident_id is required")
	}
	if err := CheckReason(req.Reason); err != nil {
		return req, Prepared{}, err
	}
	// The reason and incident id are stored in the terminal record and
	// returned by history: like metadata, they must not hold what may be
	// credential material (the one rule, SecretShaped). The error names
	// the field only, never the value.
	if SecretShaped(req.Reason) {
		return req, Prepared{}, Invalid("reason", "must not hold credentials or secrets: it looks like credential material (star_sk_, bearer, or 64 hex digits)")
	}
	if req.IncidentID != "" {
		if err := CheckOpaqueID("incident_id", req.IncidentID); err != nil {
			return req, Prepared{}, err
		}
		if SecretShaped(req.IncidentID) {
			return req, Prepared{}, Invalid("incident_id", "must not hold credentials or secrets: it looks like credential material (star_sk_ or 64 hex digits)")
		}
	}
	h := (&fieldHasher{}).add("op", string(op)).add("lock_key", key).
		add("owner_principal_id", req.Caller.PrincipalID).add("lease_id", req.LeaseID).
		add("fencing_token", utoa(req.FencingToken)).add("reason", req.Reason).add("incident_id", req.IncidentID)
	return req, prepared(op, id, key, req.Mutation, h), nil
}

// IsControlOrFormat reports whether r is a control or format character or
// a line or paragraph separator: text that can forge lines in a log, or
// move and reorder what a terminal shows, as control characters can.
func IsControlOrFormat(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// CheckReason bounds an administrator reason: printable UTF-8, no control
// characters, at most 512 bytes. Empty is allowed when an incident id is given.
func CheckReason(reason string) error {
	if len(reason) > MaxReasonBytes {
		return Invalid("reason", "must be at most 512 bytes")
	}
	if !utf8.ValidString(reason) {
		return Invalid("reason", "must be valid UTF-8")
	}
	for _, r := range reason {
		if IsControlOrFormat(r) {
			return Invalid("reason", "must not contain control or format characters")
		}
	}
	if reason != "" && strings.TrimSpace(reason) == "" {
		return Invalid("reason", "must not be blank")
	}
	return nil
}

// PrepareInspect validates an inspect request: exactly one of an identity or
// a lease id. For an identity it returns the lock key.
func PrepareInspect(req InspectRequest, o StoreOptions) (InspectRequest, string, error) {
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return req, "", err
	}
	hasID := req.Identity != (Identity{})
	switch {
	case hasID && req.LeaseID != "":
		return req, "", Invalid("lease_id", "give either lock_identity or lease_id, not both")
	case req.LeaseID != "":
		return req, "", CheckOpaqueID("lease_id", req.LeaseID)
	case !hasID:
		return req, "", Invalid("lock_identity", "lock_identity or lease_id is required")
	}
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, "", err
	}
	req.Identity = id
	return req, key, nil
}

func checkDeadline(d time.Time) error {
	if d.IsZero() {
		return Invalid("deadline_at", "a finite deadline is required")
	}
	return nil
}

// PreparedCommit is a validated commit authorization.
type PreparedCommit struct {
	Identity Identity
	LockKey  string
	// Scope identifies the commit: (lock key, sink, commit id).
	Scope  string
	Digest string
}

// PrepareCommit validates a commit authorization request.
func PrepareCommit(req CommitRequest, o StoreOptions) (CommitRequest, PreparedCommit, error) {
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return req, PreparedCommit{}, err
	}
	req.Identity = id
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return req, PreparedCommit{}, err
	}
	if err := CheckOpaqueID("owner_principal_id", req.Caller.PrincipalID); err != nil {
		return req, PreparedCommit{}, err
	}
	if err := checkHeld(req.LeaseID, req.FencingToken, req.ServiceInstanceID); err != nil {
		return req, PreparedCommit{}, err
	}
	sink, err := NormalizeIdentifier("sink", req.Sink)
	if err != nil {
		return req, PreparedCommit{}, err
	}
	req.Sink = sink
	for _, f := range []struct{ name, v string }{{"commit_id", req.CommitID}, {"execution_id", req.ExecutionID}, {"job_id", req.JobID}} {
		if err := CheckOpaqueID(f.name, f.v); err != nil {
			return req, PreparedCommit{}, err
		}
	}
	if req.TraceID != "" {
		if err := CheckOpaqueID("trace_id", req.TraceID); err != nil {
			return req, PreparedCommit{}, err
		}
	}
	scope := (&fieldHasher{}).add("op", "commit").add("lock_key", key).add("sink", sink).add("commit_id", req.CommitID).b64()
	outbox := ""
	if m := req.Outbox; m != nil {
		if err := checkOutboxMessage(m); err != nil {
			return req, PreparedCommit{}, err
		}
		if req.Target != "" || req.PayloadSHA256 != "" {
			return req, PreparedCommit{}, Invalid("target", "a publication is its own target: give target and payload_sha256 only without outbox")
		}
		req.Target, req.PayloadSHA256 = OutboxMessageID(scope), PayloadSHA256(m.Body)
		oh := (&fieldHasher{}).add("exchange", m.Exchange).add("routing_key", m.RoutingKey).
			add("content_type", m.ContentType).add("body_sha256", req.PayloadSHA256)
		if len(m.Headers) > 0 {
			// Only when present: the digest of a header-less publication,
			// stored in existing idempotency records, stays what it was.
			oh.add("headers", string(headersDigestInput(m.Headers)))
		}
		outbox = string(oh.buf)
	}
	if err := CheckCommitTarget(req.Target); err != nil {
		return req, PreparedCommit{}, err
	}
	if err := CheckPayloadSHA256(req.PayloadSHA256); err != nil {
		return req, PreparedCommit{}, err
	}
	h := (&fieldHasher{}).add("op", "commit").add("lock_key", key).add("owner_principal_id", req.Caller.PrincipalID).
		add("lease_id", req.LeaseID).add("fencing_token", utoa(req.FencingToken)).
		add("service_instance_id", req.ServiceInstanceID).add("sink", sink).add("commit_id", req.CommitID).
		add("execution_id", req.ExecutionID).add("job_id", req.JobID).add("trace_id", req.TraceID).
		add("target", req.Target).add("payload_sha256", req.PayloadSHA256).add("outbox", outbox)
	return req, PreparedCommit{Identity: id, LockKey: key, Scope: scope, Digest: h.hex()}, nil
}

// CheckCommitTarget validates the target of a commit: the object one write
// changes in its sink, such as a document id. It is opaque to the backend
// and compared byte for byte by the sink, so it is bounded, valid UTF-8 and
// free of control and format characters, and never empty.
func CheckCommitTarget(t string) error {
	switch {
	case t == "":
		return Invalid("target", "the write this commit is for is required")
	case len(t) > MaxCommitTargetBytes:
		return Invalid("target", "must be at most 2048 bytes")
	case !utf8.ValidString(t):
		return Invalid("target", "must be valid UTF-8")
	}
	for _, r := range t {
		if IsControlOrFormat(r) {
			return Invalid("target", "must not contain control or format characters")
		}
	}
	return nil
}

// PayloadSHA256 is the payload digest of body: the hex SHA-256 of its
// bytes, as every sink and the outbox compute it.
func PayloadSHA256(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// CheckPayloadSHA256 validates a payload digest: empty (the sink cannot
// check a payload) or 64 lower-case hex digits.
func CheckPayloadSHA256(d string) error {
	if d == "" {
		return nil
	}
	if !isSHA256Hex(d) {
		return Invalid("payload_sha256", "must be 64 lower-case hex digits")
	}
	return nil
}

// isSHA256Hex reports 64 lower-case hex digits: a SHA-256 as this module
// writes every digest.
func isSHA256Hex(s string) bool { return len(s) == 64 && LowerHex(s) }

// LowerHex reports that every byte of s is a lower-case hex digit, as
// hex.EncodeToString writes them.
func LowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// PrepareLookup validates a request lookup and returns its idempotency scope.
func PrepareLookup(req LookupRequest, o StoreOptions) (Prepared, error) {
	if !req.Op.Valid() {
		return Prepared{}, Invalid("operation", "unknown operation")
	}
	if err := checkDeadline(req.DeadlineAt); err != nil {
		return Prepared{}, err
	}
	id, key, err := o.identity(req.Identity)
	if err != nil {
		return Prepared{}, err
	}
	if err := CheckOpaqueID("owner_principal_id", req.PrincipalID); err != nil {
		return Prepared{}, err
	}
	if err := CheckOpaqueID("request_id", req.RequestID); err != nil {
		return Prepared{}, err
	}
	return Prepared{Op: req.Op, Identity: id, LockKey: key, Scope: IdempotencyScope(req.Op, key, req.PrincipalID, req.RequestID),
		Principal: req.PrincipalID}, nil
}
