package valkey

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// mutation is the shared part of one lease mutation's function call.
type mutation struct {
	p   lease.Prepared
	tag string
	due lease.Timestamp
}

func (s *Store) prepare(ctx context.Context, p lease.Prepared, at time.Time) mutation {
	return mutation{p: p, tag: tagOf(p.LockKey), due: lease.Deadline(ctx, at)}
}

// keys are the common KEYS: active, history, index, expiry schedule,
// evidence, quarantine, the namespace gate.
func (s *Store) commonKeys(tag, evidence string) []string {
	return []string{s.keys.active(tag), s.keys.history(tag), s.keys.index(), s.keys.expiry(), evidence, s.keys.quarantine(tag),
		s.keys.gate()}
}

// commonArgs are the common ARGV (see library.lua's context).
func (s *Store) commonArgs(due lease.Timestamp, lockKey, tag string, id lease.Identity, retention time.Duration) []string {
	return []string{itoa(due.UnixMilli()), lockKey, tag,
		id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass,
		ms(s.reclaimGrace), strconv.Itoa(s.opts.HistoryPerIdentity), ms(s.opts.HistoryRetention), ms(retention)}
}

// Acquire grants a lease if no unexpired active lease holds the identity.
func (s *Store) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAcquire(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.Result{}, err
	}
	m := s.prepare(ctx, p, req.DeadlineAt)
	// The lease id is made here so its lookup key can be declared in KEYS;
	// its time part is the adapter's clock at submission, an ordering hint
	// only (the id is opaque and the record's times are backend time).
	newID := lease.NewLeaseID
	if s.leaseIDs != nil {
		newID = s.leaseIDs
	}
	leaseID := newID(lease.At(time.Now()))
	meta := []byte("{}")
	if len(req.Metadata) > 0 {
		if meta, err = json.Marshal(req.Metadata); err != nil {
			return lease.Result{}, lease.Invalid("metadata", "not encodable")
		}
	}
	keys := append(s.commonKeys(m.tag, s.keys.idem(m.tag, p.Scope)), s.keys.counter(m.tag), s.keys.leaseLookup(leaseID),
		s.keys.counterFloor())
	args := append(s.commonArgs(m.due, p.LockKey, m.tag, p.Identity, s.opts.IdempotencyRetention),
		leaseID, req.Caller.PrincipalID, req.Caller.ClientID, req.Caller.CredentialID, req.ServiceInstanceID,
		ms(req.TTL), ms(req.MaximumLifetime), req.ExecutionID, req.JobID, req.TraceID, req.RequestID,
		string(meta), p.Digest, ms(req.MaximumLifetime+s.reclaimGrace+s.opts.HistoryRetention), p.Scope, s.writeFormat())
	rep, err := s.fcall(ctx, call{fn: "acquire", mutation: true, keys: keys, args: args, wait: s.waitFor(m.due)})
	if err != nil {
		return lease.Result{}, err
	}
	switch rep.status {
	case "ok":
		return s.leaseResult(m, rep, lease.CodeAcquired)
	case "conflict":
		exp, err := strconv.ParseInt(rep.at(0), 10, 64)
		if err != nil {
			return lease.Result{}, s.malformed(call{fn: "acquire", mutation: true})
		}
		return lease.Result{}, lease.Conflict(rep.now, lease.UnixMilli(exp))
	case "exhausted":
		return lease.Result{}, lease.CounterExhausted(s.log, p.Identity, rep.now)
	case "collision":
		// A fresh 80-bit random lease id already in use: nothing changed.
		return lease.Result{}, lease.Errorf(lease.CodeBackendUnavailable, "lease id collision; retry")
	case "embedded":
		return s.replayEmbedded(p, rep)
	}
	return s.common(m, rep, "acquire")
}

// Renew extends the exact matching active lease.
func (s *Store) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRenew(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	if err := s.writable(ctx); err != nil {
		return lease.Result{}, err
	}
	m := s.prepare(ctx, p, req.DeadlineAt)
	args := append(s.commonArgs(m.due, p.LockKey, m.tag, p.Identity, s.opts.IdempotencyRetention),
		req.LeaseID, utoa(req.FencingToken), req.Caller.PrincipalID, req.ServiceInstanceID, ms(req.TTL), p.Digest, s.writeFormat())
	rep, err := s.fcall(ctx, call{fn: "renew", mutation: true, keys: s.commonKeys(m.tag, s.keys.idem(m.tag, p.Scope)),
		args: args, wait: s.waitFor(m.due)})
	if err != nil {
		return lease.Result{}, err
	}
	if rep.status == "ok" {
		return s.leaseResult(m, rep, lease.CodeRenewed)
	}
	return s.common(m, rep, "renew")
}

// Release ends the exact matching active lease (compare-and-delete).
func (s *Store) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRelease(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	return s.finish(ctx, p, req.DeadlineAt, ending{code: lease.CodeReleased, leaseID: req.LeaseID, token: req.FencingToken,
		principal: req.Caller.PrincipalID, instance: req.ServiceInstanceID, requestID: req.RequestID})
}

// ForceRelease ends the observed active lease with the operational terminal
// state, recording the administrator's reason.
func (s *Store) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpForceRelease, req)
}

// Revoke ends the observed active lease with the security terminal state.
func (s *Store) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return s.admin(ctx, lease.OpRevoke, req)
}

func (s *Store) admin(ctx context.Context, op lease.Op, req lease.AdminRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAdmin(op, req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	code, _ := lease.AdminOutcome(op) // the function library sets the state
	reason := ""
	if req.Reason != "" {
		b, err := json.Marshal(req.Reason)
		if err != nil {
			return lease.Result{}, lease.Invalid("reason", "not encodable")
		}
		reason = string(b)
	}
	return s.finish(ctx, p, req.DeadlineAt, ending{code: code, leaseID: req.LeaseID, token: req.FencingToken,
		principal: req.Caller.PrincipalID, requestID: req.RequestID, reason: reason, incident: req.IncidentID})
}

// ending is how a lease ends: the success code, the lease as the request
// names it, who ends it (and, for a release, from which service
// instance) and why.
type ending struct {
	code      lease.Code
	leaseID   string
	token     uint64
	principal string
	instance  string
	requestID string
	reason    string // JSON-encoded, as the history entry stores it
	incident  string
}

// finish runs release, force-release or revoke (p.Op says which).
func (s *Store) finish(ctx context.Context, p lease.Prepared, at time.Time, e ending) (lease.Result, error) {
	if err := s.writable(ctx); err != nil {
		return lease.Result{}, err
	}
	m := s.prepare(ctx, p, at)
	args := append(s.commonArgs(m.due, p.LockKey, m.tag, p.Identity, s.opts.IdempotencyRetention),
		e.leaseID, utoa(e.token), e.principal, e.instance, p.Digest, e.requestID, e.reason, e.incident, string(p.Op), s.writeFormat())
	rep, err := s.fcall(ctx, call{fn: "finish", mutation: true, keys: s.commonKeys(m.tag, s.keys.idem(m.tag, p.Scope)),
		args: args, wait: s.waitFor(m.due)})
	if err != nil {
		return lease.Result{}, err
	}
	if rep.status == "ok" {
		return s.leaseResult(m, rep, e.code)
	}
	return s.common(m, rep, string(p.Op))
}

// leaseResult turns an "ok" reply carrying the record into the result.
func (s *Store) leaseResult(m mutation, rep reply, code lease.Code) (lease.Result, error) {
	rec, err := s.decodeRecord([]byte(rep.at(0)), m.p.LockKey)
	if err != nil {
		return lease.Result{}, s.corrupt(m.p.Identity, "the backend returned a record that fails strict decoding: "+lease.AsError(err).Reason)
	}
	return lease.Result{Code: code, Lease: rec, BackendTime: rep.now}, nil
}

// common maps the replies every lease mutation shares.
func (s *Store) common(m mutation, rep reply, fn string) (lease.Result, error) {
	if err := s.refused(m.p.Identity, rep); err != nil {
		return lease.Result{}, err
	}
	if rep.status == "evidence" {
		return s.replay(m.p, rep)
	}
	return lease.Result{}, s.malformed(call{fn: fn, mutation: true})
}

// refused maps the refusals every mutation (commits included) shares; nil
// for another reply.
func (s *Store) refused(id lease.Identity, rep reply) error {
	switch rep.status {
	case "deadline":
		return lease.DeadlineExceeded(rep.now)
	case "closed":
		return s.closedNamespace(rep)
	case "lost":
		return lease.Lost(rep.now)
	case "corrupt":
		return s.corrupt(id, rep.at(0))
	}
	return nil
}

// closedNamespace is the refusal of a mutation while the namespace's gate
// is closed: nothing changed, and it is retryable once recovery (or a
// backup's pause) has reopened the namespace.
func (s *Store) closedNamespace(rep reply) *lease.Error {
	return &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "namespace is closed: " + gateReason(rep.at(0)),
		BackendTime: rep.now.Time()}
}

// replay answers a mutation from its stored idempotency evidence: the
// original result, or idempotency_conflict if the request id was used with
// other inputs. A replayed acquire or renewal also reports the lease's
// state now.
func (s *Store) replay(p lease.Prepared, rep reply) (lease.Result, error) {
	raw, ok := evidenceBytes(p, rep)
	if !ok {
		return lease.Result{}, s.corrupt(p.Identity, "idempotency evidence is corrupt")
	}
	ev, err := p.DecodeEvidence([]byte(raw))
	if err != nil {
		return lease.Result{}, s.corrupt(p.Identity, "idempotency evidence is corrupt")
	}
	return p.Replay(ev, rep.now, func(orig *lease.Record) (*lease.Record, error) { return s.currentOf(orig, rep, p.Identity) })
}

// embeddedAcquisition strictly decodes an "embedded" reply (fields 0, 1: an
// active record of version 3 and its PTTL) read for p: the acquisition's
// evidence it carries, as version 1 bytes, and how to find the lease's
// state now (that record, which is the lease's: the reply is its own).
// Anything else (another version, another lock key or scope, no TTL) is
// corrupt.
func (s *Store) embeddedAcquisition(p lease.Prepared, rep reply) ([]byte, func(*lease.Record) (*lease.Record, error), error) {
	if rep.at(1) == "-1" {
		return nil, nil, s.corrupt(p.Identity, "active key has no TTL")
	}
	rec, e, err := lease.DecodeEmbeddingRecordAt([]byte(rep.at(0)), p.LockKey)
	if err == nil && (e == nil || e.Scope != p.Scope || rec.LockKey != p.LockKey) {
		err = lease.Errorf(lease.CodeCorrupt, "the record carries no evidence of this request")
	}
	var raw []byte
	if err == nil {
		raw, err = e.Acquisition(rec)
	}
	if err != nil {
		return nil, nil, s.corrupt(p.Identity, "embedded idempotency evidence is corrupt: "+lease.AsError(err).Reason)
	}
	current := func(orig *lease.Record) (*lease.Record, error) {
		return lease.CurrentOf(orig, rec, rep.now, func() *lease.HistoryEntry { return nil }), nil
	}
	return raw, current, nil
}

// replayEmbedded answers an acquire from the evidence its lease's active
// record carries (format 4): the original result with the state now, or
// idempotency_conflict for another digest.
func (s *Store) replayEmbedded(p lease.Prepared, rep reply) (lease.Result, error) {
	raw, current, err := s.embeddedAcquisition(p, rep)
	if err != nil {
		return lease.Result{}, err
	}
	ev, err := p.DecodeEvidence(raw)
	if err != nil {
		return lease.Result{}, s.corrupt(p.Identity, "embedded idempotency evidence is corrupt")
	}
	return p.Replay(ev, rep.now, current)
}

// currentOf finds the state now of a lease from an evidence reply: its
// active record (fields 1, 2: value and PTTL), else its terminal record
// (fields 3…: history entries naming it), else expired: the only terminal
// state that needs no evidence.
func (s *Store) currentOf(orig *lease.Record, rep reply, id lease.Identity) (*lease.Record, error) {
	cur, err := s.decodeActive(rep.at(1), rep.at(2), orig.LockKey, id)
	if err != nil {
		return nil, err
	}
	return lease.CurrentOf(orig, cur, rep.now, func() *lease.HistoryEntry {
		h, _ := findHistory(rep.f[min(3, len(rep.f)):], orig.LockKey, orig.LeaseID)
		return h
	}), nil
}

// evidenceBytes is the stored evidence of an "evidence" reply read for p,
// as version 1 bytes: version 1 as it is, version 2 expanded, version 6
// (format 8: whole, checked) checked against p's scope and expanded,
// version 3 (format 5: by reference) or 5 (format 7: lean, by reference)
// rebuilt from the history entry of the lease it names among the reply's; its
// operation and the entry's own scope for it must be p's (evidence copied
// under another key is never answered). ok is false if it cannot be;
// strict decoding of the result is the caller's.
func evidenceBytes(p lease.Prepared, rep reply) (string, bool) {
	raw := rep.at(0)
	op, leaseID, lean := lease.LeanIDLeaseID(raw)
	if !lean {
		var ok bool
		if leaseID, ok = lease.ReferredLeaseID(raw); !ok {
			return lease.ExpandEvidenceFor(raw, p)
		}
		if !strings.HasPrefix(raw, lease.EvidenceRefPrefix+string(p.Op)+"\n") {
			return "", false
		}
		op = p.Op
	}
	h, entry := findHistory(rep.f[min(3, len(rep.f)):], p.LockKey, leaseID)
	if h == nil || op != p.Op || h.EvidenceScope(p.Op) != p.Scope {
		return "", false
	}
	if lean {
		return lease.ExpandLeanIDEvidence(raw, entry, h.Record, h.EndedAt)
	}
	return lease.ExpandReferringEvidence(raw, h.Record)
}

// findHistory returns the first entry (newest first) that strictly decodes
// and names leaseID under lockKey, and its bytes.
func findHistory(entries []string, lockKey, leaseID string) (*lease.HistoryEntry, string) {
	for _, e := range entries {
		if h, err := lease.DecodeScopedHistory([]byte(e), lockKey); err == nil && h.Record.LeaseID == leaseID && h.Record.LockKey == lockKey {
			return h, e
		}
	}
	return nil, ""
}

// decodeRecord strictly decodes a record read under lockKey (version 4
// rebuilt as version 3 first).
func (s *Store) decodeRecord(raw []byte, lockKey string) (*lease.Record, error) {
	if bytes.HasPrefix(raw, []byte(lease.RecordV4Prefix)) {
		v3, ok := lease.ExpandLeanRecord(string(raw), lockKey)
		if !ok {
			return nil, lease.Errorf(lease.CodeCorrupt, "record: version 4 is malformed")
		}
		raw = []byte(v3)
	}
	rec, err := s.records.Decode(raw)
	if err != nil {
		return nil, err
	}
	if rec.LockKey != lockKey {
		return nil, lease.Errorf(lease.CodeCorrupt, "record: stored under a foreign lock key")
	}
	return rec, nil
}

// decodeActive strictly decodes an active record read with its PTTL: nil if
// there is none; corrupt (alerted) if it has no TTL or fails decoding.
func (s *Store) decodeActive(raw, pttl, lockKey string, id lease.Identity) (*lease.Record, error) {
	if raw == "" {
		return nil, nil
	}
	if pttl == "-1" {
		return nil, s.corrupt(id, "active key has no TTL")
	}
	rec, err := s.decodeRecord([]byte(raw), lockKey)
	if err != nil {
		return nil, s.corrupt(id, lease.AsError(err).Reason)
	}
	return rec, nil
}

// corrupt alerts operators and fails closed with the uniform corrupt
// error; reason goes to the log only.
func (s *Store) corrupt(id lease.Identity, reason string) *lease.Error {
	return lease.CorruptState(s.log, id, reason)
}

// AuthorizeCommit validates, at the linearization point, that the exact
// lease is active and unexpired and its token is not below the sink's
// high-water mark, then records the accepted commit and raises the mark.
func (s *Store) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	req, p, err := lease.PrepareCommit(req, s.opts)
	if err != nil {
		return lease.CommitResult{}, err
	}
	if req.ReplayOnly {
		return s.replayCommit(ctx, p, lease.Deadline(ctx, req.DeadlineAt))
	}
	if err := s.writable(ctx); err != nil {
		return lease.CommitResult{}, err
	}
	tag, d := tagOf(p.LockKey), lease.Deadline(ctx, req.DeadlineAt)
	head, tail, err := commitTemplate(req, p.Digest)
	if err != nil {
		return lease.CommitResult{}, err
	}
	msgID := lease.OutboxMessageID(p.Scope)
	obHead, obTail, err := outboxTemplate(req, p, msgID)
	if err != nil {
		return lease.CommitResult{}, err
	}
	keys := append(s.commonKeys(tag, s.keys.commit(tag, p.Scope)), s.keys.marks(tag), s.keys.outbox(), s.keys.outboxMsg(msgID),
		s.keys.commitSeq(tag), s.keys.outboxSeq(), s.keys.outboxBytes())
	var size int64
	if req.Outbox != nil {
		size = req.Outbox.Size()
	}
	args := append(s.commonArgs(d, p.LockKey, tag, p.Identity, s.opts.CommitRetention),
		req.LeaseID, utoa(req.FencingToken), req.Caller.PrincipalID, req.ServiceInstanceID, req.Sink, head, tail,
		obHead, obTail, msgID, req.ExecutionID, req.JobID,
		itoa(size), itoa(s.opts.OutboxMaxPending), itoa(s.opts.OutboxMaxBytes), ms(s.opts.IdempotencyRetention), s.writeFormat())
	rep, err := s.fcall(ctx, call{fn: "commit", mutation: true, keys: keys, args: args, wait: s.waitFor(d)})
	if err != nil {
		return lease.CommitResult{}, err
	}
	switch rep.status {
	case "ok", "evidence":
		c, err := lease.DecodeCommit([]byte(rep.at(0)))
		if err != nil {
			return lease.CommitResult{}, s.corrupt(p.Identity, "accepted-commit evidence is corrupt")
		}
		if rep.status == "ok" {
			return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, BackendTime: rep.now}, nil
		}
		if c.Digest != p.Digest {
			return lease.CommitResult{}, lease.CommitIdempotencyConflict(rep.now)
		}
		return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: rep.now}, nil
	case "full":
		full := lease.OutboxFull(rep.at(0))
		full.BackendTime = rep.now.Time()
		return lease.CommitResult{}, full
	case "rejected":
		return lease.CommitResult{}, lease.CommitRejected(s.log, p.Identity, rep.now)
	}
	if err := s.refused(p.Identity, rep); err != nil {
		return lease.CommitResult{}, err
	}
	return lease.CommitResult{}, s.malformed(call{fn: "commit", mutation: true})
}

// replayCommit answers a ReplayOnly commit p from its accepted-commit
// evidence alone: the read-only lookup function (FCALL_RO, flagged
// no-writes, as LookupRequest) returns the evidence at backend time, and
// the replay or idempotency_conflict is decided as the commit function's
// "evidence" reply is. The lease is not checked and nothing is written.
func (s *Store) replayCommit(ctx context.Context, p lease.PreparedCommit, d lease.Timestamp) (lease.CommitResult, error) {
	tag := tagOf(p.LockKey)
	rep, err := s.read(ctx, d, "lookup", []string{s.keys.commit(tag, p.Scope), s.keys.active(tag), s.keys.history(tag)}, "")
	if err != nil {
		return lease.CommitResult{}, err
	}
	switch rep.status {
	case "none":
		return lease.CommitResult{}, lease.RequestNotFound(rep.now)
	case "corrupt":
		return lease.CommitResult{}, s.corrupt(p.Identity, rep.at(0))
	case "evidence":
		c, err := lease.DecodeCommit([]byte(rep.at(0)))
		switch {
		case err != nil:
			return lease.CommitResult{}, s.corrupt(p.Identity, "accepted-commit evidence is corrupt")
		case c.Digest != p.Digest:
			return lease.CommitResult{}, lease.CommitIdempotencyConflict(rep.now)
		}
		return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: rep.now}, nil
	}
	return lease.CommitResult{}, s.malformed(call{fn: "lookup"})
}

// epochMarker is how accepted_at encodes in the commit template.
const epochMarker = `"accepted_at":"1970-01-01T00:00:00.000Z"`

// seqMarker is how the commit seq and accepted_at encode in the commit
// template: the two members are adjacent, and the function fills both.
const seqMarker = `"commit_seq":1,` + epochMarker

// commitTemplate encodes the accepted-commit evidence with lease's own
// encoder and splits it around commit_seq and accepted_at, which the
// function fills with the identity's next commit seq and backend time: the
// stored bytes are exactly lease.EncodeCommit's. The head ends with
// `"commit_seq":`, the tail starts after the accepted_at value.
func commitTemplate(req lease.CommitRequest, digest string) (string, string, error) {
	b, err := lease.EncodeCommit(req.Commit(lease.UnixMilli(0), 1, digest))
	i := bytes.Index(b, []byte(seqMarker))
	if err != nil || i < 0 || bytes.Count(b, []byte(seqMarker)) != 1 {
		return "", "", lease.Invalid("commit_id", "not encodable")
	}
	return string(b[:i+len(`"commit_seq":`)]), string(b[i+len(seqMarker)-1:]), nil
}

// outboxTemplate is the outbox entry of a commit's publication, split
// around accepted_at like commitTemplate; empty without a publication.
func outboxTemplate(req lease.CommitRequest, p lease.PreparedCommit, msgID string) (string, string, error) {
	if req.Outbox == nil {
		return "", "", nil
	}
	b, err := lease.EncodeOutboxEntry(lease.OutboxEntry{MessageID: msgID, Identity: p.Identity, LockKey: p.LockKey,
		LeaseID: req.LeaseID, FencingToken: req.FencingToken, ExecutionID: req.ExecutionID, TraceID: req.TraceID,
		Sink: req.Sink, CommitID: req.CommitID, AcceptedAt: lease.UnixMilli(0), Message: *req.Outbox})
	return splitAtAccepted(b, err, "outbox")
}

// splitAtAccepted splits an encoded outbox entry around its accepted_at
// value, which the function fills with backend time. The entry's own
// member is the first occurrence: it encodes before the message, whose
// headers are the only caller text that can spell the marker verbatim (a
// header named accepted_at), so a marker after "message" is never it.
func splitAtAccepted(b []byte, err error, field string) (string, string, error) {
	i := bytes.Index(b, []byte(epochMarker))
	if err != nil || i < 0 || bytes.Contains(b[:i], []byte(`"message":`)) {
		return "", "", lease.Invalid(field, "not encodable")
	}
	cut := i + len(`"accepted_at":"`)
	return string(b[:cut]), string(b[i+len(epochMarker)-1:]), nil
}
