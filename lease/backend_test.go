package lease

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every result a backend decides is built here once: its code, reason,
// backend time and retry hint are what the backends answered before.
func TestBackendResults(t *testing.T) {
	now, later := UnixMilli(msAcquired), UnixMilli(msExpires)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cases := []struct {
		name   string
		err    *Error
		code   Code
		reason string
		at     time.Time
		retry  time.Duration
	}{
		{"deadline", DeadlineExceeded(now), CodeDeadlineExceeded, "deadline elapsed before the operation started", now.Time(), 0},
		{"deadline before submission", DeadlineExceeded(Timestamp{}), CodeDeadlineExceeded, "deadline elapsed before the operation started", time.Time{}, 0},
		{"lost", Lost(now), CodeLost, "the lease is not held", now.Time(), 0},
		{"not found", NotFound(now), CodeNotFound, "no such lease", now.Time(), 0},
		{"request not found", RequestNotFound(now), CodeNotFound, "no committed result for this request id", now.Time(), 0},
		{"conflict", Conflict(now, later), CodeConflict, "another unexpired lease holds the identity", now.Time(), 50 * time.Second},
		{"idempotency conflict", IdempotencyConflict(now), CodeIdempotencyConflict, "request id was reused with different inputs", now.Time(), 0},
		{"commit idempotency conflict", CommitIdempotencyConflict(now), CodeIdempotencyConflict, "commit id was reused with different inputs", now.Time(), 0},
		{"counter exhausted", CounterExhausted(log, contractIdentity(), now), CodeCounterExhausted, "the fencing counter reached 2^53-1", now.Time(), 0},
		{"commit rejected", CommitRejected(log, contractIdentity(), now), CodeCommitRejected, "fencing token is below the sink's high-water mark", now.Time(), 0},
		{"corrupt", CorruptState(log, contractIdentity(), "record: bad"), CodeCorrupt, "stored lease state is corrupt; failing closed", time.Time{}, 0},
	}
	for _, tc := range cases {
		e := tc.err
		if e.Code != tc.code || e.Reason != tc.reason || !e.BackendTime.Equal(tc.at) || e.RetryAfter != tc.retry || e.Field != "" || e.PublicReason {
			t.Errorf("%s = %+v", tc.name, e)
		}
	}
	for _, want := range []string{
		"ALERT fencing counter exhausted; acquisition refused", "ALERT commit token below the sink's high-water mark",
		"ALERT corrupt lease state; failing closed", "reason=\"record: bad\"", "tenant_id=tenant-main", "operation_class=default",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("alerts lack %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), goldenContractKey) {
		t.Error("an alert names the raw lock key")
	}
	if IdentityAttrs(Identity{}) != nil {
		t.Error("the zero identity has log attributes")
	}
}

// The deadline rule: work starts strictly before its deadline; the
// deadline is the earlier of the request's and the context's.
func TestDeadlineRule(t *testing.T) {
	due := UnixMilli(msAcquired)
	if err := PastDeadline(due.Add(-time.Millisecond), due); err != nil {
		t.Fatalf("before the deadline: %v", err)
	}
	for _, now := range []Timestamp{due, due.Add(time.Millisecond)} {
		if err := PastDeadline(now, due); CodeOf(err) != CodeDeadlineExceeded || !AsError(err).BackendTime.Equal(now.Time()) {
			t.Fatalf("at %v: %v", now, err)
		}
	}
	at := due.Time().Add(time.Hour)
	if got := Deadline(context.Background(), at); got != At(at) {
		t.Fatalf("without a context deadline: %v", got)
	}
	ctx, cancel := context.WithDeadline(context.Background(), due.Time())
	defer cancel()
	if got := Deadline(ctx, at); got != due {
		t.Fatalf("an earlier context deadline: %v", got)
	}
	if got := Deadline(ctx, due.Time().Add(-time.Hour)); got != due.Add(-time.Hour) {
		t.Fatalf("an earlier request deadline: %v", got)
	}

	if err := CheckStart(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := CheckStart(context.Background(), true); CodeOf(err) != CodeBackendUnavailable || AsError(err).Reason != "store is closed" {
		t.Fatalf("closed: %v", err)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := CheckStart(done, false); CodeOf(err) != CodeDeadlineExceeded || !AsError(err).BackendTime.IsZero() {
		t.Fatalf("done: %v", err)
	}
}

// A replay and a lookup answer from evidence, with the lease's state now
// where it changed; a history entry matches only the lease it ends.
func TestEvidenceAnswers(t *testing.T) {
	now := UnixMilli(msExpires + 1)
	d1, d2 := strings.Repeat("1", 64), strings.Repeat("2", 64)
	rec := validRecord()
	// Principal and scope as PrepareLookup sets them: the caller, here the
	// lease's owner, and its request's scope.
	p := Prepared{Op: OpAcquire, Identity: contractIdentity(), LockKey: rec.LockKey, Digest: d1, Principal: rec.OwnerPrincipalID,
		Scope: rec.AcquisitionScope()}
	ev := &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: d1, Code: CodeAcquired, Lease: rec, BackendTime: UnixMilli(msAcquired)}
	raw, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ended := rec.Clone()
	ended.State = StateReleased
	hist := &HistoryEntry{HistoryVersion: HistoryVersion, Record: ended, EndedAt: UnixMilli(msRenewed), EndedBy: "prn_actor_01"}
	hraw, err := hist.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if h := MatchHistory(hraw, rec.LeaseID); h == nil || h.Record.State != StateReleased {
		t.Fatalf("MatchHistory = %+v", h)
	}
	if MatchHistory(hraw, "lease_02") != nil || MatchHistory([]byte("{"), rec.LeaseID) != nil {
		t.Fatal("MatchHistory matched another lease or a corrupt entry")
	}

	// The state now: active (observed at now), else terminal, else expired.
	none := func() *HistoryEntry { return nil }
	if cur := CurrentOf(rec, rec, now, none); cur.State != StateExpired || cur.LeaseID != rec.LeaseID {
		t.Fatalf("active past expiry = %+v", cur)
	}
	other := rec.Clone()
	other.LeaseID = "lease_02"
	if cur := CurrentOf(rec, other, now, func() *HistoryEntry { return hist }); cur.State != StateReleased {
		t.Fatalf("ended = %+v", cur)
	}
	if cur := CurrentOf(rec, nil, now, none); cur.State != StateExpired || rec.State != StateActive {
		t.Fatalf("without evidence = %+v (orig %s)", cur, rec.State)
	}

	released := func(*Record) (*Record, error) { return ended, nil }
	r, err := p.Replay(ev, now, released)
	if err != nil || r.Code != CodeAcquired || !r.Replayed || r.Lease.LeaseID != rec.LeaseID || r.Op != OpAcquire || r.Current != ended {
		t.Fatalf("Replay = %+v, %v", r, err)
	}
	r, err = p.Replay(ev, now, func(*Record) (*Record, error) { return rec, nil })
	if err != nil || r.Current != nil {
		t.Fatalf("Replay of an unchanged lease = %+v, %v", r, err)
	}
	failed := errors.New("corrupt")
	if _, err := p.Replay(ev, now, func(*Record) (*Record, error) { return nil, failed }); err != failed {
		t.Fatalf("Replay whose state cannot be read: %v", err)
	}
	renew := p
	renew.Op = OpRenew
	for name, q := range map[string]Prepared{"op": renew, "digest": {Op: OpAcquire, LockKey: rec.LockKey, Digest: d2},
		"lock key": {Op: OpAcquire, LockKey: KeyPrefix + "other", Digest: d1}} {
		if _, err := q.Replay(ev, now, released); CodeOf(err) != CodeIdempotencyConflict || !AsError(err).BackendTime.Equal(now.Time()) {
			t.Fatalf("Replay with another %s: %v", name, err)
		}
	}
	// A renewal's answer said the caller holds the lease, as an acquire's
	// did: its replay reports the state now where it changed. A release's
	// does not look it up.
	renewEv := *ev
	renewEv.Op = OpRenew
	if r, err := renew.Replay(&renewEv, now, released); err != nil || r.Current != ended {
		t.Fatalf("Replay of a renewal of an ended lease = %+v, %v", r, err)
	}
	if r, err := renew.Replay(&renewEv, now, func(*Record) (*Record, error) { return rec, nil }); err != nil || r.Current != nil {
		t.Fatalf("Replay of a renewal of an unchanged lease = %+v, %v", r, err)
	}
	damaged := Errorf(CodeCorrupt, "stored lease state is corrupt")
	if r, err := renew.Replay(&renewEv, now, func(*Record) (*Record, error) { return nil, damaged }); err != nil || r.Code != CodeAcquired || r.Current != nil {
		t.Fatalf("Replay of a renewal whose record is corrupt (its own evidence intact) = %+v, %v", r, err)
	}
	unread := Errorf(CodeBackendUnavailable, "read failed")
	if _, err := renew.Replay(&renewEv, now, func(*Record) (*Record, error) { return nil, unread }); err != unread {
		t.Fatalf("Replay of a renewal whose state could not be read: %v, want the read's error", err)
	}
	release, releaseEv := p, *ev
	release.Op, releaseEv.Op = OpRelease, OpRelease
	if r, err := release.Replay(&releaseEv, now, func(*Record) (*Record, error) { t.Fatal("a release looked up the state now"); return nil, nil }); err != nil || r.Current != nil {
		t.Fatalf("Replay of a release = %+v, %v", r, err)
	}

	if r, ok := p.Lookup(raw, released); !ok || r.Code != CodeAcquired || r.Current != ended {
		t.Fatalf("Lookup = %+v, %v", r, ok)
	}
	if r, ok := p.Lookup(raw, func(*Record) (*Record, error) { return nil, failed }); !ok || r.Current != nil {
		t.Fatalf("Lookup whose state cannot be read = %+v, %v", r, ok)
	}
	if _, ok := renew.Lookup(raw, released); ok {
		t.Fatal("Lookup accepted evidence of another operation")
	}
	stranger := p
	stranger.Principal = "prn_other"
	if _, ok := stranger.Lookup(raw, released); ok {
		t.Fatal("Lookup accepted evidence of a lease another principal owns")
	}
	// An acquisition answers only the request that acquired it: under
	// another request's scope (the same owner, another request id) it is
	// corrupt, in a lookup (ok false) and to a backend's replay
	// (DecodeEvidence); evidence of another operation, or that granted nothing,
	// is left to the other checks.
	another := p
	another.Scope = IdempotencyScope(OpAcquire, rec.LockKey, rec.OwnerPrincipalID, rec.RequestID+"-another")
	if !p.answers(ev) || another.answers(ev) {
		t.Fatalf("answers: own request %v, another request %v", p.answers(ev), another.answers(ev))
	}
	if _, err := another.DecodeEvidence(raw); CodeOf(err) != CodeCorrupt {
		t.Fatalf("DecodeEvidence of an acquisition under another request's scope: %v, want corrupt", err)
	}
	if got, err := p.DecodeEvidence(raw); err != nil || got.Lease.LeaseID != rec.LeaseID {
		t.Fatalf("DecodeEvidence of its own request: %+v, %v", got, err)
	}
	if _, ok := another.Lookup(raw, released); ok {
		t.Fatal("Lookup accepted an acquisition under another request's scope")
	}
	refused := *ev
	refused.Code = CodeConflict
	if !another.answers(&refused) || !another.answers(&releaseEv) {
		t.Fatal("answers refused evidence that granted no lease to the request")
	}
	if _, ok := p.Lookup([]byte("{}"), released); ok {
		t.Fatal("Lookup accepted corrupt evidence")
	}
	// A lookup has no digest to compare: any inputs of the request id.
	if _, ok := (Prepared{Op: OpAcquire, LockKey: rec.LockKey, Principal: rec.OwnerPrincipalID, Scope: p.Scope}).Lookup(raw, released); !ok {
		t.Fatal("Lookup compared the digest")
	}
}

// The reaper runs its pass every interval until stopped, bounding each
// pass only when asked, and logs failures other than unavailability.
func TestReaper(t *testing.T) {
	// Read only once every reaper has stopped (wg.Wait).
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, bounded := range []bool{false, true} {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		passes := make(chan bool, 16)
		n := 0
		Reaper{Interval: 5 * time.Millisecond, Bounded: bounded, Log: log, Pass: func(ctx context.Context) error {
			_, hasDeadline := ctx.Deadline()
			passes <- hasDeadline
			if n++; n%2 == 0 {
				return Errorf(CodeBackendUnavailable, "store is closed")
			}
			return Errorf(CodeCorrupt, "x")
		}}.Start(&wg, stop)
		for range 2 {
			if got := <-passes; got != bounded {
				t.Fatalf("bounded %v: a pass had a deadline: %v", bounded, got)
			}
		}
		close(stop)
		wg.Wait()
	}
	if c := strings.Count(logs.String(), "lease store cleanup failed"); c < 2 || strings.Contains(logs.String(), "code=lease_backend_unavailable") {
		t.Fatalf("logs:\n%s", logs.String())
	}
	var wg sync.WaitGroup
	Reaper{Interval: -1, Pass: func(context.Context) error { t.Fatal("a disabled reaper ran"); return nil }}.Start(&wg, nil)
	wg.Wait()
}
