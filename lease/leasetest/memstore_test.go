package leasetest

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/starintel/starlease/lease"
)

// memStore is the suite's reference store: one mutex is the linearization
// point, time.Now (never moving backwards) the backend clock. It exists only
// to validate the suite and is never a real backend.
//
// LEASETEST_MEMSTORE_BUGS (comma-separated names of bugs below) makes it
// deliberately wrong, to check that the suite catches each bug.
type memStore struct {
	mu        sync.Mutex
	opts      lease.StoreOptions
	bugs      map[string]bool
	closed    bool
	last      time.Time
	active    map[string]stored               // lock key → active record
	counters  map[string]uint64               // lock key → fencing counter
	history   map[string][]lease.HistoryEntry // lock key → terminal evidence, newest first
	leases    map[string]string               // lease id → lock key
	idem      map[string]*lease.IdempotencyRecord
	commits   map[string]lease.Commit // commit scope → accepted commit
	highWater map[string]uint64       // lock key ‖ sink → highest accepted token
	commitSeq map[string]uint64       // lock key → last commit seq
	outbox    []lease.OutboxEntry     // accepted publications, in order
	dead      []lease.DeadLetter      // publications set aside, in order
}

// stored is a raw active record and its decoding (done once, when stored).
type stored struct {
	raw []byte
	rec *lease.Record
	err error
}

func decoded(raw []byte) stored {
	rec, err := lease.DecodeRecord(raw)
	return stored{raw: raw, rec: rec, err: err}
}

var _ lease.Store = (*memStore)(nil)
var _ Faults = (*memStore)(nil)

func newMemStore(o lease.StoreOptions) *memStore {
	m := &memStore{opts: o.WithDefaults(), bugs: map[string]bool{},
		active: map[string]stored{}, counters: map[string]uint64{}, history: map[string][]lease.HistoryEntry{},
		leases: map[string]string{}, idem: map[string]*lease.IdempotencyRecord{},
		commits: map[string]lease.Commit{}, highWater: map[string]uint64{}, commitSeq: map[string]uint64{}}
	for _, b := range strings.Split(os.Getenv("LEASETEST_MEMSTORE_BUGS"), ",") {
		if b != "" {
			m.bugs[b] = true
		}
	}
	return m
}

func (m *memStore) now() lease.Timestamp {
	t := time.Now()
	if t.Before(m.last) {
		t = m.last
	}
	m.last = t
	return lease.At(t)
}

// begin is the start of the atomic section: closed stores are unavailable,
// passed deadlines exceeded.
func (m *memStore) begin(deadline time.Time) (lease.Timestamp, error) {
	if m.closed {
		return lease.Timestamp{}, lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	}
	now := m.now()
	if !now.Time().Before(deadline) && !m.bugs["ignore_deadline"] {
		return now, &lease.Error{Code: lease.CodeDeadlineExceeded, Reason: "deadline passed", BackendTime: now.Time()}
	}
	return now, nil
}

// load decodes the active record of key, failing closed on anything that
// is not a valid record of exactly this key.
func (m *memStore) load(key string) (*lease.Record, error) {
	st, ok := m.active[key]
	if !ok {
		return nil, nil
	}
	rec, err := st.rec.Clone(), st.err
	if err == nil && rec.LockKey != key && !m.bugs["trust_stored_key"] {
		err = lease.Errorf(lease.CodeCorrupt, "record stored under another key")
	}
	if err != nil {
		if m.bugs["overwrite_corrupt"] {
			return nil, nil
		}
		return nil, err
	}
	return rec, nil
}

func (m *memStore) put(rec *lease.Record) error {
	raw, err := rec.Encode()
	if err != nil {
		return lease.Errorf(lease.CodeCorrupt, "cannot encode record")
	}
	m.active[rec.LockKey] = decoded(raw)
	m.leases[rec.LeaseID] = rec.LockKey
	return nil
}

// end moves the active record to history in a terminal state.
func (m *memStore) end(rec *lease.Record, state lease.State, now lease.Timestamp, by, requestID, reason, incident string) *lease.Record {
	t := rec.Clone()
	t.State = state
	delete(m.active, rec.LockKey)
	h := append([]lease.HistoryEntry{{HistoryVersion: lease.HistoryVersion, Record: t, EndedAt: now, EndedBy: by,
		RequestID: requestID, Reason: reason, IncidentID: incident}}, m.history[rec.LockKey]...)
	if len(h) > m.opts.HistoryPerIdentity && !m.bugs["history_unbounded"] {
		h = h[:m.opts.HistoryPerIdentity]
	}
	m.history[rec.LockKey] = h
	return t.Clone()
}

// expire moves an expired active-shaped record to history; it returns the
// record if it is still live.
func (m *memStore) expire(rec *lease.Record, now lease.Timestamp) *lease.Record {
	if rec == nil || rec.LiveAt(now) || m.bugs["no_expiry"] {
		return rec
	}
	m.end(rec, lease.StateExpired, rec.ExpiresAt, "", "", "", "")
	return nil
}

// current is the lease now: the observed active record or its terminal evidence.
func (m *memStore) current(leaseID string, now lease.Timestamp) *lease.Record {
	key, ok := m.leases[leaseID]
	if !ok {
		return nil
	}
	if rec, err := m.load(key); err == nil && rec != nil && rec.LeaseID == leaseID {
		return rec.ObservedAt(now)
	}
	for _, h := range m.history[key] {
		if h.Record.LeaseID == leaseID {
			return h.Record.Clone()
		}
	}
	return nil
}

// replay returns the stored result of p, if any.
func (m *memStore) replay(p lease.Prepared, now lease.Timestamp) (lease.Result, bool, error) {
	ev, ok := m.idem[p.Scope]
	if !ok || m.bugs["no_idempotency"] {
		return lease.Result{}, false, nil
	}
	if ev.Digest != p.Digest && !m.bugs["ignore_digest"] {
		return lease.Result{}, true, lease.Errorf(lease.CodeIdempotencyConflict, "request id reused with different inputs")
	}
	res := ev.Result()
	if cur := m.current(ev.Lease.LeaseID, now); cur != nil && cur.State != ev.Lease.State {
		res.Current = cur
	}
	return res, true, nil
}

func (m *memStore) store(p lease.Prepared, code lease.Code, rec *lease.Record, now lease.Timestamp) {
	m.idem[p.Scope] = &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: p.Op, Digest: p.Digest,
		Code: code, Lease: rec.Clone(), BackendTime: now}
}

// matches is the exact-tuple check of renew, release and commit.
func (m *memStore) matches(rec *lease.Record, now lease.Timestamp, leaseID, principal, instance string, token uint64) bool {
	if rec == nil {
		return false
	}
	live := rec.LiveAt(now) || (m.bugs["revive_expired"] && rec.State == lease.StateActive)
	return live && rec.LeaseID == leaseID && rec.OwnerPrincipalID == principal &&
		(rec.ServiceInstanceID == instance || m.bugs["ignore_instance"]) &&
		(rec.FencingToken == token || m.bugs["ignore_token"])
}

func lost() error { return lease.Errorf(lease.CodeLost, "lease is no longer held") }

func (m *memStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAcquire(req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.Result{}, err
	}
	if res, ok, err := m.replay(p, now); ok {
		return res, err
	}
	cur, err := m.load(p.LockKey)
	if err != nil {
		return lease.Result{}, err
	}
	if cur = m.expire(cur, now); cur != nil {
		return lease.Result{}, &lease.Error{Code: lease.CodeConflict, Reason: "target lease is held",
			RetryAfter: max(cur.ExpiresAt.Time().Sub(now.Time()), time.Millisecond), BackendTime: now.Time()}
	}
	if m.bugs["racy_acquire"] {
		m.mu.Unlock()
		time.Sleep(time.Millisecond)
		m.mu.Lock()
	}
	c := m.counters[p.LockKey]
	if c >= lease.MaxFencingToken && !m.bugs["wrap_counter"] {
		return lease.Result{}, lease.Errorf(lease.CodeCounterExhausted, "fencing counter exhausted")
	}
	if m.bugs["wrap_counter"] && c >= lease.MaxFencingToken {
		c = 0
	}
	rec := &lease.Record{RecordVersion: lease.RecordVersion, LockKey: p.LockKey, LeaseID: lease.NewLeaseID(now),
		OwnerPrincipalID: req.Caller.PrincipalID, OwnerClientID: req.Caller.ClientID, OwnerCredentialID: req.Caller.CredentialID,
		ServiceInstanceID: req.ServiceInstanceID, FencingToken: c + 1, AcquiredAt: now, RenewedAt: now,
		ExpiresAt: now.Add(min(req.TTL, req.MaximumLifetime)), TTLMs: req.TTL.Milliseconds(),
		MaximumLifetimeMs: req.MaximumLifetime.Milliseconds(), ExecutionID: req.ExecutionID, JobID: req.JobID,
		TraceID: req.TraceID, RequestID: req.RequestID, Metadata: req.Metadata, State: lease.StateActive}
	rec.SetIdentity(p.Identity)
	if err := m.put(rec); err != nil {
		return lease.Result{}, err
	}
	m.counters[p.LockKey] = c + 1
	m.store(p, lease.CodeAcquired, rec, now)
	return lease.Result{Code: lease.CodeAcquired, Lease: rec.Clone(), BackendTime: now}, nil
}

func (m *memStore) Renew(ctx context.Context, req lease.RenewRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRenew(req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.Result{}, err
	}
	if res, ok, err := m.replay(p, now); ok {
		return res, err
	}
	cur, err := m.load(p.LockKey)
	if err != nil {
		return lease.Result{}, err
	}
	if !m.matches(cur, now, req.LeaseID, req.Caller.PrincipalID, req.ServiceInstanceID, req.FencingToken) {
		return lease.Result{}, lost()
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = time.Duration(cur.TTLMs) * time.Millisecond
	}
	rec := cur.Clone()
	rec.RenewedAt, rec.TTLMs = now, ttl.Milliseconds()
	rec.ExpiresAt = now.Add(ttl)
	if limit := rec.AcquiredAt.Add(time.Duration(rec.MaximumLifetimeMs) * time.Millisecond); limit.Before(rec.ExpiresAt) && !m.bugs["no_lifetime_cap"] {
		rec.ExpiresAt = limit
	}
	if err := m.put(rec); err != nil {
		return lease.Result{}, err
	}
	m.store(p, lease.CodeRenewed, rec, now)
	return lease.Result{Code: lease.CodeRenewed, Lease: rec.Clone(), BackendTime: now}, nil
}

func (m *memStore) Release(ctx context.Context, req lease.ReleaseRequest) (lease.Result, error) {
	req, p, err := lease.PrepareRelease(req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.Result{}, err
	}
	if res, ok, err := m.replay(p, now); ok {
		return res, err
	}
	cur, err := m.load(p.LockKey)
	if err != nil {
		return lease.Result{}, err
	}
	if !m.matches(cur, now, req.LeaseID, req.Caller.PrincipalID, req.ServiceInstanceID, req.FencingToken) {
		return lease.Result{}, lost()
	}
	rec := m.end(cur, lease.StateReleased, now, req.Caller.PrincipalID, req.RequestID, "", "")
	if m.bugs["reset_counter_on_release"] {
		delete(m.counters, p.LockKey)
	}
	m.store(p, lease.CodeReleased, rec, now)
	return lease.Result{Code: lease.CodeReleased, Lease: rec, BackendTime: now}, nil
}

func (m *memStore) ForceRelease(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return m.admin(lease.OpForceRelease, req)
}

func (m *memStore) Revoke(ctx context.Context, req lease.AdminRequest) (lease.Result, error) {
	return m.admin(lease.OpRevoke, req)
}

func (m *memStore) admin(op lease.Op, req lease.AdminRequest) (lease.Result, error) {
	req, p, err := lease.PrepareAdmin(op, req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.Result{}, err
	}
	if res, ok, err := m.replay(p, now); ok {
		return res, err
	}
	cur, err := m.load(p.LockKey)
	if err != nil {
		return lease.Result{}, err
	}
	if cur == nil || !cur.LiveAt(now) || cur.LeaseID != req.LeaseID ||
		(cur.FencingToken != req.FencingToken && !m.bugs["ignore_token"]) {
		return lease.Result{}, lost()
	}
	code, state := lease.CodeForceReleased, lease.StateReleased
	if op == lease.OpRevoke {
		code, state = lease.CodeRevoked, lease.StateRevoked
	}
	rec := m.end(cur, state, now, req.Caller.PrincipalID, req.RequestID, req.Reason, req.IncidentID)
	m.store(p, code, rec, now)
	return lease.Result{Code: code, Lease: rec, BackendTime: now}, nil
}

func (m *memStore) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	req, key, err := lease.PrepareInspect(req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.Result{}, err
	}
	var rec *lease.Record
	if req.LeaseID != "" {
		rec = m.current(req.LeaseID, now)
	} else {
		cur, err := m.load(key)
		if err != nil {
			return lease.Result{}, err
		}
		if cur != nil {
			rec = cur.ObservedAt(now)
		}
	}
	if rec == nil {
		return lease.Result{}, lease.Errorf(lease.CodeNotFound, "no such lease")
	}
	return lease.Result{Code: lease.CodeInspected, Lease: rec, BackendTime: now}, nil
}

func (m *memStore) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	pg, err := lease.PrepareList(req, m.opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	f, after, size := pg.Filter, pg.After, pg.Size
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.ListResult{}, err
	}
	var all []*lease.Record
	for key := range m.active {
		rec, err := m.load(key)
		if err != nil || rec == nil || (!rec.LiveAt(now) && !m.bugs["list_expired"]) {
			continue
		}
		var v string
		switch f.By {
		case lease.ListByOwner:
			v = lease.OwnerIndexValue(rec.OwnerPrincipalID)
		case lease.ListByTarget:
			v = lease.TargetIndexValue(rec.Identity())
		case lease.ListByProgram:
			v = lease.ProgramIndexValue(rec.Identity())
		}
		if v == f.Value && rec.LeaseID > after {
			all = append(all, rec)
		}
	}
	slices.SortFunc(all, func(a, b *lease.Record) int { return strings.Compare(a.LeaseID, b.LeaseID) })
	res := lease.ListResult{BackendTime: now}
	if len(all) > size {
		all = all[:size]
		res.NextPageToken = lease.EncodePageToken(all[size-1].LeaseID, string(f.By)+"\x00"+f.Value)
	}
	res.Leases = all
	return res, nil
}

func (m *memStore) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	pg, err := lease.PrepareHistory(req, m.opts)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	key, after, size := pg.LockKey, pg.After, pg.Size
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	entries := m.history[key]
	if after != "" {
		i := slices.IndexFunc(entries, func(h lease.HistoryEntry) bool { return h.Record.LeaseID == after })
		entries = entries[i+1:]
	}
	res := lease.HistoryResult{BackendTime: now}
	if len(entries) > size {
		entries = entries[:size]
		res.NextPageToken = lease.EncodePageToken(entries[size-1].Record.LeaseID, "history\x00"+key)
	}
	for _, h := range entries {
		h.Record = h.Record.Clone()
		res.Entries = append(res.Entries, h)
	}
	return res, nil
}

func (m *memStore) AuthorizeCommit(ctx context.Context, req lease.CommitRequest) (lease.CommitResult, error) {
	req, p, err := lease.PrepareCommit(req, m.opts)
	if err != nil {
		return lease.CommitResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now, err := m.begin(req.DeadlineAt)
	if err != nil {
		return lease.CommitResult{}, err
	}
	if c, ok := m.commits[p.Scope]; ok {
		if c.Digest != p.Digest && !m.bugs["commit_replay_any_write"] {
			return lease.CommitResult{}, lease.Errorf(lease.CodeIdempotencyConflict, "commit id reused with different inputs")
		}
		return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, Replayed: true, BackendTime: now}, nil
	}
	if req.ReplayOnly && !m.bugs["replay_only_commits"] {
		return lease.CommitResult{}, lease.RequestNotFound(now)
	}
	cur, err := m.load(p.LockKey)
	if err != nil {
		return lease.CommitResult{}, err
	}
	if !m.matches(cur, now, req.LeaseID, req.Caller.PrincipalID, req.ServiceInstanceID, req.FencingToken) ||
		(!m.bugs["commit_any_job"] && (cur.ExecutionID != req.ExecutionID || cur.JobID != req.JobID)) {
		return lease.CommitResult{}, lost()
	}
	hw := p.LockKey + "\x00" + req.Sink
	if req.FencingToken < m.highWater[hw] && !m.bugs["no_high_water"] {
		return lease.CommitResult{}, lease.Errorf(lease.CodeCommitRejected, "token below the high-water mark")
	}
	if req.Outbox != nil && !m.bugs["outbox_unbounded"] {
		u := m.outboxUsage()
		if full := m.opts.OutboxRoom(u.Pending, u.Bytes, req.Outbox.Size()); full != nil {
			return lease.CommitResult{}, full
		}
	}
	if !m.bugs["reuse_commit_seq"] || m.commitSeq[p.LockKey] == 0 {
		m.commitSeq[p.LockKey]++
	}
	c := req.Commit(now, m.commitSeq[p.LockKey], p.Digest)
	m.commits[p.Scope] = c
	m.highWater[hw] = max(m.highWater[hw], req.FencingToken)
	if req.Outbox != nil {
		m.outbox = append(m.outbox, lease.OutboxEntry{MessageID: lease.OutboxMessageID(p.Scope), Identity: p.Identity,
			LockKey: p.LockKey, LeaseID: req.LeaseID, FencingToken: req.FencingToken, ExecutionID: req.ExecutionID,
			TraceID: req.TraceID, Sink: req.Sink, CommitID: req.CommitID, AcceptedAt: now, Message: *req.Outbox})
	}
	return lease.CommitResult{Code: lease.CodeCommitAuthorized, Commit: c, BackendTime: now}, nil
}

func (m *memStore) OutboxPending(ctx context.Context, limit int) ([]lease.OutboxEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit <= 0 || limit > len(m.outbox) {
		limit = len(m.outbox)
	}
	return append([]lease.OutboxEntry(nil), m.outbox[:limit]...), nil
}

func (m *memStore) OutboxDone(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, e := range m.outbox {
		if e.MessageID == id {
			m.outbox = append(m.outbox[:i], m.outbox[i+1:]...)
			break
		}
	}
	return nil
}

func (m *memStore) OutboxDeadLetter(ctx context.Context, id, reason string) error {
	if err := lease.CheckOpaqueID("message_id", id); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, e := range m.outbox {
		if e.MessageID == id {
			m.outbox = append(m.outbox[:i], m.outbox[i+1:]...)
			m.dead = append(m.dead, lease.DeadLetter{Entry: e, Reason: lease.CutDeadLetterReason(reason), DeadAt: m.now()})
			break
		}
	}
	return nil
}

func (m *memStore) OutboxDeadLetters(ctx context.Context, limit int) ([]lease.DeadLetter, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit <= 0 || limit > len(m.dead) {
		limit = len(m.dead)
	}
	return append([]lease.DeadLetter(nil), m.dead[:limit]...), nil
}

func (m *memStore) OutboxDeadLen(ctx context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.dead)), nil
}

func (m *memStore) OutboxRequeueDeadLetter(ctx context.Context, id string) (lease.DeadLetter, error) {
	return m.takeDeadLetter(id, true)
}

func (m *memStore) OutboxDiscardDeadLetter(ctx context.Context, id string) (lease.DeadLetter, error) {
	return m.takeDeadLetter(id, false)
}

func (m *memStore) takeDeadLetter(id string, requeue bool) (lease.DeadLetter, error) {
	if err := lease.CheckOpaqueID("message_id", id); err != nil {
		return lease.DeadLetter{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.IndexFunc(m.dead, func(d lease.DeadLetter) bool { return d.Entry.MessageID == id })
	if i < 0 {
		return lease.DeadLetter{}, lease.NoDeadLetter()
	}
	d := m.dead[i]
	if requeue {
		if slices.ContainsFunc(m.outbox, func(e lease.OutboxEntry) bool { return e.MessageID == id }) {
			return lease.DeadLetter{}, lease.DeadLetterPending()
		}
		u := m.outboxUsage()
		if full := m.opts.OutboxRoom(u.Pending, u.Bytes, d.Entry.Message.Size()); full != nil {
			return lease.DeadLetter{}, full
		}
		m.outbox = append(m.outbox, d.Entry)
	}
	m.dead = slices.Delete(m.dead, i, i+1)
	return d, nil
}

// outboxUsage sums the pending outbox (the reference store needs no
// counters).
func (m *memStore) outboxUsage() lease.OutboxUsage {
	u := lease.OutboxUsage{Pending: int64(len(m.outbox)), MaxPending: m.opts.OutboxMaxPending, MaxBytes: m.opts.OutboxMaxBytes}
	for _, e := range m.outbox {
		u.Bytes += e.Message.Size()
	}
	return u
}

func (m *memStore) OutboxUsage(ctx context.Context) (lease.OutboxUsage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.outboxUsage(), nil
}

func (m *memStore) SetOutboxBounds(maxPending, maxBytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.opts.OutboxMaxPending, m.opts.OutboxMaxBytes = maxPending, maxBytes
}

func (m *memStore) LookupRequest(ctx context.Context, req lease.LookupRequest) (lease.Result, error) {
	p, err := lease.PrepareLookup(req, m.opts)
	if err != nil {
		return lease.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.begin(req.DeadlineAt); err != nil {
		return lease.Result{}, err
	}
	ev, ok := m.idem[p.Scope]
	if !ok {
		return lease.Result{}, lease.Errorf(lease.CodeNotFound, "request never committed")
	}
	return ev.Result(), nil
}

func (m *memStore) Health(ctx context.Context) lease.Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return lease.Health{Status: lease.HealthUnavailable, Reason: "closed"}
	}
	return lease.Health{Status: lease.HealthOK}
}

func (m *memStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// Faults.

func (m *memStore) Counter(ctx context.Context, key string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counters[key], nil
}

func (m *memStore) SetCounter(ctx context.Context, key string, v uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counters[key] = v
	return nil
}

func (m *memStore) PutRawActive(ctx context.Context, key string, raw []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active[key] = decoded(append([]byte(nil), raw...))
	return nil
}

func (m *memStore) ExpireIfCurrent(ctx context.Context, key, leaseID string, token uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, err := m.load(key)
	if err != nil || rec == nil {
		return err
	}
	if m.bugs["unconditional_cleanup"] || (rec.LeaseID == leaseID && rec.FencingToken == token && !rec.LiveAt(m.now())) {
		m.end(rec, lease.StateExpired, rec.ExpiresAt, "", "", "", "")
	}
	return nil
}
