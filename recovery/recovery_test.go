package recovery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

var ident = lease.Identity{TenantID: "tenant-main", ProgramID: "program-a",
	TargetNamespace: "starintel-target", TargetID: "target-1", ActorName: "usernamegen"}

var caller = lease.Caller{PrincipalID: "prn-actor", ClientID: "client-1", CredentialID: "key-1"}

func far() time.Time { return time.Now().Add(time.Minute) }

func acquire(id string) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: ident, ServiceInstanceID: "instance-1", TTL: time.Hour,
		MaximumLifetime: 2 * time.Hour, ExecutionID: "execution-1", JobID: "job-1",
		Mutation: lease.Mutation{RequestID: id, DeadlineAt: far(), Caller: caller}}
}

func commit(l *lease.Record, id string) lease.CommitRequest {
	return lease.CommitRequest{Identity: ident, LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "instance-1", Sink: "couchdb", CommitID: id, ExecutionID: l.ExecutionID, JobID: l.JobID,
		Target: "doc:" + id, DeadlineAt: far(), Caller: caller}
}

func release(l *lease.Record, id string) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: ident, LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "instance-1", Mutation: lease.Mutation{RequestID: id, DeadlineAt: far(), Caller: caller}}
}

// underLease acquires target's lease on s with request id requestID, runs
// work with the lease and its committer, and releases the lease unless
// keep. It returns the lease.
func underLease(t *testing.T, s lease.Store, target, requestID string, keep bool,
	work func(l *lease.Record, c *fence.Committer)) *lease.Record {
	t.Helper()
	ctx := context.Background()
	req := acquire(requestID)
	req.Identity.TargetID = target
	res, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("acquire %s: %v", target, err)
	}
	work(res.Lease, fence.NewCommitter(s, fence.EnvelopeOf(res.Lease), caller))
	if !keep {
		rel := release(res.Lease, "rel-"+requestID)
		rel.Identity = req.Identity
		if _, err := s.Release(ctx, rel); err != nil {
			t.Fatal(err)
		}
	}
	return res.Lease
}

func open(t *testing.T, path string) *bolt.Store {
	t.Helper()
	s, err := bolt.Open(path, bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// scenario: a backup while a lease is held, then more work (higher tokens
// accepted downstream), then the old backup restored into a new path.
type scenario struct {
	path       string
	stale      *lease.Record // held at backup time
	downstream Proof         // tokens accepted after the backup
	maxToken   uint64
}

func setup(t *testing.T) scenario {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "live.db"))
	res, err := s.Acquire(ctx, acquire("req-before"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthorizeCommit(ctx, commit(res.Lease, "commit-before")); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := s.Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	sc := scenario{path: filepath.Join(dir, "restored.db"), stale: res.Lease}
	sc.downstream.Observe(res.Lease.LockKey, res.Lease.FencingToken)
	cur := res.Lease
	for i := range 5 { // keep working: tokens grow and are accepted downstream
		if _, err := s.Release(ctx, release(cur, "rel-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
		next, err := s.Acquire(ctx, acquire("req-after-"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		cur = next.Lease
		if _, err := s.AuthorizeCommit(ctx, commit(cur, "commit-after-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
		sc.downstream.Observe(cur.LockKey, cur.FencingToken)
		sc.maxToken = cur.FencingToken
	}
	if _, err := ReadBackup(bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := bolt.NewNamespace(sc.path, bolt.Options{}).Restore(ctx, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	return sc
}

// mustBeClosed checks that the bolt namespace at path refuses mutations
// (a replay included) with backend_unavailable.
func mustBeClosed(t *testing.T, path string) {
	t.Helper()
	s := open(t, path)
	defer s.Close()
	if _, err := s.Acquire(context.Background(), acquire("req-before")); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("acquire in a closed namespace: %v", err)
	}
}

// verifyBolt runs Verify on the restored bolt store at path.
func verifyBolt(t *testing.T, path string, proof Proof, o Options) (Report, error) {
	t.Helper()
	ns, err := bolt.NewNamespace(path, bolt.Options{ReapInterval: -1}).OpenClosed(context.Background())
	if err != nil {
		return Report{}, err
	}
	return Verify(context.Background(), ns, proof, o)
}

func TestRestoreEpochPath(t *testing.T) {
	ctx := context.Background()
	sc := setup(t)
	// (a) the namespace refuses work until verified.
	mustBeClosed(t, sc.path)
	sc.downstream.Complete = false // proof unavailable/incomplete: epoch path
	rec := &audittest.Recorder{}
	rep, err := verifyBolt(t, sc.path, sc.downstream, Options{Audit: rec})
	if err != nil {
		t.Fatal(err)
	}
	// Every step is audited, the decision first.
	ev := rec.Events()
	if len(ev) != 3 || ev[0].EventType != audit.EventRecoveryVerify || ev[1].EventType != audit.EventRecoveryRevoke ||
		ev[2].EventType != audit.EventRecoveryReopen || !strings.Contains(ev[0].Reason, "epoch path") ||
		!strings.Contains(ev[1].Reason, sc.stale.LeaseID) {
		t.Fatalf("audit events: %+v", ev)
	}
	for _, e := range ev {
		if err := e.Validate(); err != nil || e.Priority != audit.PriorityHigh || e.Decision != audit.DecisionAllow {
			t.Fatalf("audit event %+v: %v", e, err)
		}
	}
	if !rep.Epoch || rep.EpochNumber != 1 || rep.Floor != sc.maxToken+DefaultEpochGap || len(rep.Revoked) != 1 || rep.Revoked[0] != sc.stale.LeaseID {
		t.Fatalf("report %+v", rep)
	}
	s := open(t, sc.path)
	if h := s.Health(ctx); h.Status != lease.HealthOK {
		t.Fatalf("health after recovery: %+v", h)
	}
	// (c) the stale holder from before the restore cannot commit.
	if _, err := s.AuthorizeCommit(ctx, commit(sc.stale, "commit-stale")); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("stale commit: %v", err)
	}
	// (d) a replayed pre-backup acquire returns its original result, and
	// shows the lease revoked now.
	replay, err := s.Acquire(ctx, acquire("req-before"))
	if err != nil || replay.Lease.LeaseID != sc.stale.LeaseID || replay.Lease.FencingToken != sc.stale.FencingToken ||
		replay.Current == nil || replay.Current.State != lease.StateRevoked {
		t.Fatalf("replay: %v %+v", err, replay)
	}
	// (b) every new token is above every token accepted downstream.
	fresh, err := s.Acquire(ctx, acquire("req-new"))
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Lease.FencingToken <= sc.maxToken || fresh.Lease.FencingToken != rep.Floor+1 || fresh.Lease.LeaseID == sc.stale.LeaseID {
		t.Fatalf("new token %d, downstream max %d", fresh.Lease.FencingToken, sc.maxToken)
	}
	if _, err := s.AuthorizeCommit(ctx, commit(fresh.Lease, "commit-new")); err != nil {
		t.Fatal(err)
	}
	// An identity the backup never knew (it may have been acquired, and
	// accepted downstream, after the backup) also continues above the floor.
	unseen := acquire("req-unseen")
	unseen.Identity.TargetID = "target-created-after-the-backup"
	other, err := s.Acquire(ctx, unseen)
	if err != nil || other.Lease.FencingToken != rep.Floor+1 {
		t.Fatalf("an unseen identity after the epoch: %v token %d, want %d", err, other.Lease.FencingToken, rep.Floor+1)
	}
	// Recovery runs once: the reopened store is no longer a restored namespace.
	if _, err := verifyBolt(t, sc.path, sc.downstream, Options{}); err == nil {
		t.Fatal("verify ran twice")
	}
}

// The decision is durable before anything changes: without its audit
// event nothing is, and the namespace stays closed.
func TestVerifyRefusedWithoutAudit(t *testing.T) {
	sc := setup(t)
	if _, err := verifyBolt(t, sc.path, sc.downstream, Options{Audit: &audittest.FailingSink{}}); err == nil {
		t.Fatal("recovery ran without its audit event")
	}
	mustBeClosed(t, sc.path)
	if rep, err := verifyBolt(t, sc.path, sc.downstream, Options{}); err != nil || !rep.Epoch {
		t.Fatalf("recovery after the refusal: %+v %v", rep, err)
	}
}

// A gap past the token range is refused before anything changes, never
// wrapped around into a floor below the known tokens.
func TestEpochGapBounded(t *testing.T) {
	sc := setup(t)
	for _, gap := range []uint64{lease.MaxFencingToken + 1, 1<<64 - 1} {
		if _, err := verifyBolt(t, sc.path, sc.downstream, Options{EpochGap: gap}); lease.CodeOf(err) != lease.CodeInvalidRequest {
			t.Fatalf("gap %d: %v", gap, err)
		}
	}
	// Within the range but too far above the known tokens: exhausted.
	if _, err := verifyBolt(t, sc.path, sc.downstream, Options{EpochGap: lease.MaxFencingToken}); lease.CodeOf(err) != lease.CodeCounterExhausted {
		t.Fatalf("gap 2^53-1: %v", err)
	}
	mustBeClosed(t, sc.path)
}

func TestCompleteProofShortFallsBackToEpoch(t *testing.T) {
	sc := setup(t)
	sc.downstream.Complete = true // complete, but counters are below it
	rep, err := verifyBolt(t, sc.path, sc.downstream, Options{EpochGap: 10})
	if err != nil || !rep.Epoch || len(rep.Shortfalls) != 1 || rep.Floor != sc.maxToken+10 {
		t.Fatalf("%v %+v", err, rep)
	}
}

func TestCompleteProofReopensWithoutEpoch(t *testing.T) {
	ctx := context.Background()
	sc := setup(t)
	proof := Proof{Complete: true, Sources: []string{"test"}}
	proof.Observe(sc.stale.LockKey, sc.stale.FencingToken) // nothing newer reached downstream
	rep, err := verifyBolt(t, sc.path, proof, Options{})
	if err != nil || rep.Epoch || rep.Raised != 0 || len(rep.Revoked) != 1 {
		t.Fatalf("%v %+v", err, rep)
	}
	s := open(t, sc.path)
	// The restored lease is never resurrected; the next token follows the counter.
	next, err := s.Acquire(ctx, acquire("req-next"))
	if err != nil || next.Lease.FencingToken != sc.stale.FencingToken+1 {
		t.Fatalf("%v %+v", err, next.Lease)
	}
	if _, err := s.AuthorizeCommit(ctx, commit(sc.stale, "commit-stale")); lease.CodeOf(err) != lease.CodeLost {
		t.Fatalf("stale commit: %v", err)
	}
}

func TestReadBackupRefusesCorruption(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "a.db"))
	if _, err := s.Acquire(ctx, acquire("req-1")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	for name, c := range map[string]struct {
		edit func([]byte) []byte
		want error
	}{
		"flipped byte": {func(b []byte) []byte { b[len(b)-1] ^= 0x40; return b }, backupfile.ErrChecksum},
		"bad magic":    {func(b []byte) []byte { b[0] = 'X'; return b }, backupfile.ErrMagic},
		"truncated":    {func(b []byte) []byte { return b[:len(b)-10] }, backupfile.ErrTruncated},
		"trailing":     {func(b []byte) []byte { return append(b, 0) }, backupfile.ErrTruncated},
		"version":      {func(b []byte) []byte { return bytes.Replace(b, []byte(`"version":1`), []byte(`"version":2`), 1) }, backupfile.ErrVersion},
	} {
		if _, err := ReadBackup(bytes.NewReader(c.edit(bytes.Clone(b)))); !errors.Is(err, c.want) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ReadBackup(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

// A recovery step's log line, on a library caller's own logger, writes a
// secret-shaped detail (a 64-hex id in its reason) in its redacted form.
func TestStepLogsScreened(t *testing.T) {
	var out bytes.Buffer
	id := strings.Repeat("9f", 32)
	log := slog.New(slog.NewJSONHandler(&out, nil))
	if err := Step(context.Background(), nil, log, audit.EventRecoveryVerify, false, "high-water mark of "+id+" is missing"); err != nil {
		t.Fatal(err)
	}
	if line := out.String(); !strings.Contains(line, `"reason":"`+audit.Redacted+`"`) || strings.Contains(line, id) {
		t.Fatalf("step's line %q, want its reason redacted", line)
	}
}
