package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// Backup, restore and recovery on a real three-member cluster; one cluster
// for all of them, every subtest on prefixes of its own.
func TestRecovery(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *testenv.EtcdCluster)
	}{
		{"BackupIsOneRevisionWhileWritersRun", testBackupOneRevision},
		{"RestoreOpensClosedThenFinishRecovers", testRestoreThenFinish},
		{"SealAndStaleRecovery", testSealAndStaleRecovery},
		{"FinishRerunAfterPartialFailure", testFinishRerun},
		{"PartialRestoreIsNotRecoverable", testPartialRestore},
		{"BackupAndRestoreRefusals", testRefusals},
		{"BackupOfACompactedRevisionFails", testCompactedBackup},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, c) })
	}
}

var recCaller = lease.Caller{PrincipalID: "prn-rec", ClientID: "client-rec", CredentialID: "key-rec"}

func recFar() time.Time { return time.Now().Add(time.Minute) }

func recIdentity(target string) lease.Identity {
	return lease.Identity{TenantID: "tenant-rec", ProgramID: "program-rec", TargetNamespace: "starintel-target",
		TargetID: target, ActorName: "actor-rec"}
}

func recLockKey(t testing.TB, target string) string {
	t.Helper()
	_, k, err := lease.CanonicalLockKey(recIdentity(target), lease.StoreOptions{}.WithDefaults().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func recAcquire(target, requestID string, ttl time.Duration) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: recIdentity(target), ServiceInstanceID: "instance-rec", TTL: ttl,
		MaximumLifetime: 2 * time.Hour, ExecutionID: "execution-rec", JobID: "job-rec",
		Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: recFar(), Caller: recCaller}}
}

func recRelease(l *lease.Record, requestID string) lease.ReleaseRequest {
	return lease.ReleaseRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "instance-rec", Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: recFar(), Caller: recCaller}}
}

func recRenew(l *lease.Record, requestID string) lease.RenewRequest {
	return lease.RenewRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "instance-rec", Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: recFar(), Caller: recCaller}}
}

func recRevoke(l *lease.Record, requestID string) lease.AdminRequest {
	return lease.AdminRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken, Reason: "test",
		Mutation: lease.Mutation{RequestID: requestID, DeadlineAt: recFar(), Caller: recCaller}}
}

func recCommit(l *lease.Record, commitID string) lease.CommitRequest {
	return lease.CommitRequest{Identity: l.Identity(), LeaseID: l.LeaseID, FencingToken: l.FencingToken,
		ServiceInstanceID: "instance-rec", Sink: "couchdb", CommitID: commitID, ExecutionID: l.ExecutionID, JobID: l.JobID,
		Target: "doc:" + commitID, DeadlineAt: recFar(), Caller: recCaller}
}

// recNamespace is the namespace of prefix on c, closed in cleanup.
func recNamespace(t *testing.T, c *testenv.EtcdCluster, prefix string) *Namespace {
	t.Helper()
	n := NewNamespace(Options{Endpoints: c.Endpoints(), KeyPrefix: prefix, StoreOptions: lease.StoreOptions{Logger: testLogger(t)}})
	t.Cleanup(func() { n.Close() })
	return n
}

// recOpenClosed opens prefix for recovery, closed in cleanup.
func recOpenClosed(t *testing.T, c *testenv.EtcdCluster, prefix string) lease.ClosedNamespace {
	t.Helper()
	cn, err := recNamespace(t, c, prefix).OpenClosed(bg)
	if err != nil {
		t.Fatalf("OpenClosed: %v", err)
	}
	t.Cleanup(func() { cn.Close() })
	return cn
}

var bg = context.Background()

func mustCode(t *testing.T, what string, err error, want lease.Code) {
	t.Helper()
	if got := lease.CodeOf(err); got != want {
		t.Fatalf("%s: %v (code %q), want %s", what, err, got, want)
	}
}

// keysOf reads every key of the prefix with its value and mod revision,
// as "value@mod", to compare a prefix before and after a refusal; the
// clocks the open stores publish every second are left out.
func keysOf(t *testing.T, s *Store) map[string]string {
	t.Helper()
	r, err := s.cli.Get(bg, s.keys.p, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range r.Kvs {
		if !strings.HasPrefix(string(kv.Key), s.keys.clockPrefix()) {
			out[string(kv.Key)] = string(kv.Value) + "@" + strconv.FormatInt(kv.ModRevision, 10)
		}
	}
	return out
}

// payloadOf reads a backup's payload as key → value.
func payloadOf(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	var payload bytes.Buffer
	if _, err := backupfile.Read(bytes.NewReader(b), &payload); err != nil {
		t.Fatal(err)
	}
	entries, err := readPayload(payload.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		out[string(e.Key)] = e.Value
	}
	return out
}

// A backup taken while writers acquire, commit and release on several
// identities, over many small pages, is one revision: every active
// record's token is its identity's counter, no high-water mark or history
// token is above it, every index entry names the active lease, and the
// writers did change the prefix between its first page and its last.
func testBackupOneRevision(t *testing.T, c *testenv.EtcdCluster) {
	s := open(t, c, Options{ReapInterval: -1})
	const writers = 6
	ctx, stop := context.WithCancel(bg)
	defer stop()
	var wg sync.WaitGroup
	var done atomic.Int64
	var failed atomic.Value
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := fmt.Sprintf("busy-%d", w)
			for n := 0; ctx.Err() == nil; n++ {
				id := fmt.Sprintf("w%d-%d", w, n)
				res, err := s.Acquire(ctx, recAcquire(target, id, time.Hour))
				if err == nil {
					_, err = s.AuthorizeCommit(ctx, recCommit(res.Lease, "c-"+id))
				}
				// Every other lease stays held across the next backup page.
				if err == nil && n%2 == 0 {
					_, err = s.Release(ctx, recRelease(res.Lease, "r-"+id))
				} else if err == nil {
					time.Sleep(time.Millisecond)
					_, err = s.Release(ctx, recRelease(res.Lease, "r-"+id))
				}
				if err != nil && ctx.Err() == nil {
					failed.CompareAndSwap(nil, err.Error())
					return
				}
				done.Add(1)
			}
		}()
	}
	for done.Load() < 4*writers {
		time.Sleep(5 * time.Millisecond)
	}
	var pages int
	var atFirst, atLast int64
	scanPage, scanHook = 3, func() {
		pages++
		if pages == 1 {
			atFirst = done.Load()
		}
		atLast = done.Load()
		time.Sleep(2 * time.Millisecond)
	}
	defer func() { scanPage, scanHook = 256, nil }()
	var b bytes.Buffer
	// A scan that is not pinned to one revision never ends here (the
	// writers add keys ahead of it), so the deadline fails it too.
	bctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	h, err := s.Backup(bctx, &b)
	cancel()
	scanHook = nil
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if f := failed.Load(); f != nil {
		t.Fatalf("a writer failed: %v", f)
	}
	if pages < 20 || atLast-atFirst < writers {
		t.Fatalf("the backup read %d pages while writers completed %d rounds; want a backup across writes", pages, atLast-atFirst)
	}
	kv := payloadOf(t, b.Bytes())
	counters := map[string]uint64{}
	for k, v := range kv {
		if lk, ok := strings.CutPrefix(k, "c/"); ok {
			counters[lk], _ = readU64(v)
		}
	}
	if len(counters) != writers || h.Counts["counter"] != writers {
		t.Fatalf("backup counters %v, header counts %v", counters, h.Counts)
	}
	active := 0
	for k, v := range kv {
		switch {
		case strings.HasPrefix(k, "a/"):
			rec, err := lease.DecodeRecord(v)
			if err != nil {
				t.Fatal(err)
			}
			active++
			if rec.FencingToken != counters[rec.LockKey] {
				t.Fatalf("active token %d, counter %d: not one revision", rec.FencingToken, counters[rec.LockKey])
			}
			if _, ok := kv[s.activeExpiry(rec)[len(s.keys.p):]]; !ok {
				t.Fatal("an active record without its expiry index entry")
			}
		case strings.HasPrefix(k, "w/"):
			lk, _, _ := strings.Cut(k[2:], "\x00")
			if m, _ := readU64(v); m > counters[lk] {
				t.Fatalf("high-water mark %d above counter %d", m, counters[lk])
			}
		case strings.HasPrefix(k, "h/"):
			e, err := lease.DecodeHistoryEntry(v)
			if err != nil {
				t.Fatal(err)
			}
			if e.Record.FencingToken > counters[e.Record.LockKey] {
				t.Fatalf("history token %d above counter %d", e.Record.FencingToken, counters[e.Record.LockKey])
			}
		case strings.HasPrefix(k, "hs/"):
			seq, _ := readU64(v)
			if kv["h/"+k[3:]+"/"+hex16(seq)] == nil {
				t.Fatal("a history sequence without its newest entry")
			}
		case strings.HasPrefix(k, "x/"):
			leaseID := k[strings.LastIndexByte(k, 0)+1:]
			rec, err := lease.DecodeRecord(kv["a/"+string(v)])
			if err != nil || rec.LeaseID != leaseID {
				t.Fatalf("an index entry of lease %s without its active record (%v)", leaseID, err)
			}
		}
	}
	t.Logf("backup of %d keys over %d pages at one revision while writers completed %d rounds; %d leases active in it",
		len(kv), pages, atLast-atFirst, active)
	// The writers went on after the backup: the live counters are ahead.
	ahead := 0
	for lk, n := range counters {
		if live, _ := (faults{s}).Counter(bg, lk); live > n {
			ahead++
		} else if live < n {
			t.Fatalf("live counter %d below the backup's %d", live, n)
		}
	}
	if ahead == 0 {
		t.Fatal("no counter moved after the backup")
	}
}

// A backup restored into an empty prefix opens closed: every mutation,
// a replay and the reaper included, is refused with
// lease_backend_unavailable and changes nothing, reads answer, and a
// second restore (or one into a live prefix) is refused with nothing
// written. Recovery then reads the restored state, raises a counter, ends
// the live lease as revoked and the expired one as expired, and reopens:
// replays return their original results, the restored lease cannot renew
// or commit, and new tokens are above the floor.
func testRestoreThenFinish(t *testing.T, c *testenv.EtcdCluster) {
	src := open(t, c, Options{ReapInterval: -1})
	heldReq := recAcquire("held", "acq-held", time.Hour)
	held, err := src.Acquire(bg, heldReq)
	if err != nil {
		t.Fatal(err)
	}
	cr := recCommit(held.Lease, "commit-held")
	if _, err := src.AuthorizeCommit(bg, cr); err != nil {
		t.Fatal(err)
	}
	done, err := src.Acquire(bg, recAcquire("done", "acq-done", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Release(bg, recRelease(done.Lease, "rel-done")); err != nil {
		t.Fatal(err)
	}
	short, err := src.Acquire(bg, recAcquire("short", "acq-short", 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	h, err := src.Backup(bg, &b)
	if err != nil {
		t.Fatal(err)
	}
	if h.Backend != BackendName || h.Counts["counter"] != 3 || h.Counts["active"] != 2 || h.Counts["high_water"] != 1 {
		t.Fatalf("manifest %+v", h)
	}

	// A server runs on the empty target already (its clock is published
	// there, its reaper runs): the restore takes the prefix all the same,
	// and the server's mutations are refused from then on.
	dstPrefix := randomPrefix()
	dst := open(t, c, Options{KeyPrefix: dstPrefix, ReapInterval: 20 * time.Millisecond})
	ns := recNamespace(t, c, dstPrefix)
	if r, err := ns.Restore(bg, bytes.NewReader(b.Bytes())); err != nil || r.PayloadSHA256 != h.PayloadSHA256 {
		t.Fatalf("restore: %+v %v", r, err)
	}
	before := keysOf(t, dst)
	_, err = dst.Acquire(bg, recAcquire("fresh", "acq-fresh", time.Hour))
	mustCode(t, "acquire", err, lease.CodeBackendUnavailable)
	if !strings.Contains(err.Error(), "restored from a backup") {
		t.Fatalf("the refusal does not say why: %v", err)
	}
	_, err = dst.Acquire(bg, heldReq)
	mustCode(t, "replayed acquire", err, lease.CodeBackendUnavailable)
	_, err = dst.Renew(bg, recRenew(held.Lease, "renew"))
	mustCode(t, "renew", err, lease.CodeBackendUnavailable)
	_, err = dst.Release(bg, recRelease(held.Lease, "rel"))
	mustCode(t, "release", err, lease.CodeBackendUnavailable)
	_, err = dst.Revoke(bg, recRevoke(held.Lease, "revoke"))
	mustCode(t, "revoke", err, lease.CodeBackendUnavailable)
	_, err = dst.AuthorizeCommit(bg, recCommit(held.Lease, "commit-after"))
	mustCode(t, "commit", err, lease.CodeBackendUnavailable)
	time.Sleep(400 * time.Millisecond) // the short lease expires
	err = dst.expireIfCurrent(bg, short.Lease.LockKey, short.Lease.LeaseID, short.Lease.FencingToken)
	mustCode(t, "reaper", err, lease.CodeBackendUnavailable)
	if _, err := dst.Backup(bg, io.Discard); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("backup of a closed prefix: %v", err)
	}
	if sealed, err := dst.Seal(bg); err != nil || sealed {
		t.Fatalf("seal of a restored prefix: %t %v", sealed, err)
	}
	// Reads answer.
	ins, err := dst.Inspect(bg, lease.InspectRequest{Identity: recIdentity("held"), DeadlineAt: recFar(), Caller: recCaller})
	if err != nil || ins.Lease.LeaseID != held.Lease.LeaseID {
		t.Fatalf("inspect of a closed prefix: %+v %v", ins, err)
	}
	if hist, err := dst.History(bg, lease.HistoryRequest{Identity: recIdentity("done"), DeadlineAt: recFar(), Caller: recCaller}); err != nil ||
		len(hist.Entries) != 1 || hist.Entries[0].Record.LeaseID != done.Lease.LeaseID {
		t.Fatalf("history of a closed prefix: %+v %v", hist, err)
	}
	if hl := dst.Health(bg); hl.Status != lease.HealthDegraded {
		t.Fatalf("health %+v", hl)
	}
	// Neither a second restore nor one into the live prefix writes anything.
	if _, err := recNamespace(t, c, dstPrefix).Restore(bg, bytes.NewReader(b.Bytes())); !errors.Is(err, backupfile.ErrRestoreTarget) {
		t.Fatalf("second restore: %v", err)
	}
	srcBefore := keysOf(t, src)
	if _, err := recNamespace(t, c, src.keys.p[:len(src.keys.p)-1]).Restore(bg, bytes.NewReader(b.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("restore into a live prefix: %v", err)
	}
	if after := keysOf(t, dst); !mapsEqual(before, after) {
		t.Fatal("a refused mutation or restore changed the restored prefix")
	}
	if after := keysOf(t, src); !mapsEqual(srcBefore, after) {
		t.Fatal("a refused restore changed the live prefix")
	}

	cn := recOpenClosed(t, c, dstPrefix)
	st, err := cn.State(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Marker.BackupSHA256 != h.PayloadSHA256 || st.Counters[held.Lease.LockKey] != held.Lease.FencingToken ||
		st.Counters[done.Lease.LockKey] != done.Lease.FencingToken || st.HighWater[held.Lease.LockKey] != held.Lease.FencingToken ||
		len(st.Counters) != 3 || len(st.Active) != 2 || st.Epoch != 0 {
		t.Fatalf("restored state %+v", st)
	}
	const floor = 1000
	res, err := cn.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: floor, done.Lease.LockKey: 0},
		Floor: floor, Epoch: 1, Reason: "restored"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Raised != 1 || !slices.Equal(res.Revoked, []string{held.Lease.LeaseID}) || !slices.Equal(res.Expired, []string{short.Lease.LeaseID}) {
		t.Fatalf("finish %+v", res)
	}
	if hl := dst.Health(bg); hl.Status != lease.HealthOK {
		t.Fatalf("health after recovery %+v", hl)
	}
	hist, err := dst.History(bg, lease.HistoryRequest{Identity: recIdentity("held"), DeadlineAt: recFar(), Caller: recCaller})
	if err != nil || len(hist.Entries) != 1 || hist.Entries[0].Record.State != lease.StateRevoked ||
		hist.Entries[0].EndedBy != lease.RecoveryPrincipal || hist.Entries[0].Reason != "restored" {
		t.Fatalf("history of the revoked lease %+v %v", hist, err)
	}
	hist, err = dst.History(bg, lease.HistoryRequest{Identity: recIdentity("short"), DeadlineAt: recFar(), Caller: recCaller})
	if err != nil || len(hist.Entries) != 1 || hist.Entries[0].Record.State != lease.StateExpired ||
		hist.Entries[0].EndedAt != short.Lease.ExpiresAt {
		t.Fatalf("history of the expired lease %+v %v", hist, err)
	}
	replay, err := dst.Acquire(bg, heldReq)
	if err != nil || !replay.Replayed || replay.Lease.LeaseID != held.Lease.LeaseID || replay.Lease.FencingToken != held.Lease.FencingToken ||
		replay.Current == nil || replay.Current.State != lease.StateRevoked {
		t.Fatalf("replay after recovery: %+v %v", replay, err)
	}
	if rc, err := dst.AuthorizeCommit(bg, cr); err != nil || !rc.Replayed {
		t.Fatalf("commit replay after recovery: %+v %v", rc, err)
	}
	_, err = dst.Renew(bg, recRenew(held.Lease, "renew-after"))
	mustCode(t, "renew of a restored lease", err, lease.CodeLost)
	_, err = dst.AuthorizeCommit(bg, recCommit(held.Lease, "commit-stale"))
	mustCode(t, "commit of a restored lease", err, lease.CodeLost)
	for _, target := range []string{"held", "done", "never-seen"} {
		got, err := dst.Acquire(bg, recAcquire(target, "after-"+target, time.Hour))
		if err != nil || got.Lease.FencingToken != floor+1 {
			t.Fatalf("%s after recovery: %+v %v", target, got.Lease, err)
		}
	}
	kv := keysOf(t, dst)
	if v := kv[dst.keys.epoch()]; !strings.HasPrefix(v, string(u64(1))+"@") {
		t.Fatalf("epoch %q", v)
	}
	if _, ok := kv[dst.keys.restored()]; ok {
		t.Fatal("the restore marker outlived the recovery")
	}
	var last recoveryRecord
	if err := json.Unmarshal([]byte(strings.SplitN(kv[dst.keys.lastRecovery()], "@", 2)[0]), &last); err != nil ||
		last.Floor != floor || last.Revoked != 1 || last.Expired != 1 || len(last.Restore) == 0 {
		t.Fatalf("last recovery %+v %v", last, err)
	}
	// Recovery runs once.
	if _, err := cn.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: floor + 5}}); err == nil {
		t.Fatal("Finish ran on a reopened prefix")
	}
	if _, err := recNamespace(t, c, dstPrefix).OpenClosed(bg); !errors.Is(err, lease.ErrNamespaceOpen) {
		t.Fatalf("OpenClosed of a recovered prefix: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Seal closes an open prefix once; recovery of an open prefix is refused;
// and a recovery whose prefix was reopened and sealed again meanwhile
// cannot act: it raises nothing and ends no lease acquired since.
func testSealAndStaleRecovery(t *testing.T, c *testenv.EtcdCluster) {
	prefix := randomPrefix()
	s := open(t, c, Options{KeyPrefix: prefix, ReapInterval: -1})
	if _, err := recNamespace(t, c, prefix).OpenClosed(bg); !errors.Is(err, lease.ErrNamespaceOpen) {
		t.Fatalf("OpenClosed of an open prefix: %v", err)
	}
	if _, err := recNamespace(t, c, randomPrefix()).OpenClosed(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("OpenClosed of a prefix without a store: %v", err)
	}
	ns := recNamespace(t, c, prefix)
	if sealed, err := ns.Seal(bg); err != nil || !sealed {
		t.Fatalf("seal: %t %v", sealed, err)
	}
	if sealed, err := ns.Seal(bg); err != nil || sealed {
		t.Fatalf("second seal: %t %v", sealed, err)
	}
	_, err := s.Acquire(bg, recAcquire("a", "too-early", time.Hour))
	mustCode(t, "acquire on a sealed prefix", err, lease.CodeBackendUnavailable)
	first := recOpenClosed(t, c, prefix)
	stale := recOpenClosed(t, c, prefix)
	if st, err := first.State(bg); err != nil || st.Marker != (lease.RestoreMarker{}) || len(st.Counters) != 0 {
		t.Fatalf("state of a sealed empty prefix: %+v %v", st, err)
	}
	if _, err := first.Finish(bg, lease.RecoveryPlan{Reason: "first"}); err != nil {
		t.Fatal(err)
	}
	held, err := s.Acquire(bg, recAcquire("a", "acq-a", time.Hour))
	if err != nil || held.Lease.FencingToken != 1 {
		t.Fatalf("acquire after the first recovery: %+v %v", held, err)
	}
	if sealed, err := ns.Seal(bg); err != nil || !sealed {
		t.Fatalf("reseal: %t %v", sealed, err)
	}
	if _, err := stale.State(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("state of a stale recovery: %v", err)
	}
	res, err := stale.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: 1000}, Floor: 1000, Reason: "stale"})
	if err == nil || res.Raised != 0 || len(res.Revoked) != 0 {
		t.Fatalf("stale recovery: %+v %v", res, err)
	}
	if n, _ := (faults{s}).Counter(bg, held.Lease.LockKey); n != 1 {
		t.Fatalf("a stale recovery raised the counter to %d", n)
	}
	ins, err := s.Inspect(bg, lease.InspectRequest{Identity: recIdentity("a"), DeadlineAt: recFar(), Caller: recCaller})
	if err != nil || ins.Lease.LeaseID != held.Lease.LeaseID || ins.Lease.State != lease.StateActive {
		t.Fatalf("a stale recovery ended a lease acquired after the reopening: %+v %v", ins, err)
	}
	// The current closing's recovery does act.
	res, err = recOpenClosed(t, c, prefix).Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: 50}, Floor: 50, Reason: "second"})
	if err != nil || res.Raised != 1 || !slices.Equal(res.Revoked, []string{held.Lease.LeaseID}) {
		t.Fatalf("second recovery: %+v %v", res, err)
	}
}

// A Finish that stops part-way — once after raising the counters (as a
// crash would), once mid-way through ending the leases (its context
// cancelled, so the next transaction fails) — leaves the prefix closed;
// run again, it ends only what is still active, never lowers a counter,
// and reopens once. Groups: 100 counters are two transactions, 20 leases
// three.
func testFinishRerun(t *testing.T, c *testenv.EtcdCluster) {
	prefix := randomPrefix()
	s := open(t, c, Options{KeyPrefix: prefix, ReapInterval: -1})
	var leases []*lease.Record
	for i := range 20 {
		res, err := s.Acquire(bg, recAcquire(fmt.Sprintf("held-%d", i), fmt.Sprintf("acq-%d", i), time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, res.Lease)
	}
	const floor = 5000
	plan := lease.RecoveryPlan{Counters: map[string]uint64{}, Floor: floor, Epoch: 7, Reason: "rerun"}
	for i := range 100 {
		plan.Counters[recLockKey(t, fmt.Sprintf("held-%d", i))] = floor
	}
	if _, err := NewNamespace(Options{Endpoints: c.Endpoints(), KeyPrefix: prefix}).Seal(bg); err != nil {
		t.Fatal(err)
	}
	defer func() { finishHook = nil }()

	// Run 1 stops after the counters.
	finishHook = func(step string) error {
		if step == "raised" {
			return errors.New("crash")
		}
		return nil
	}
	res, err := recOpenClosed(t, c, prefix).Finish(bg, plan)
	if err == nil || res.Raised != 100 || len(res.Revoked) != 0 {
		t.Fatalf("run 1: %+v %v", res, err)
	}
	// Run 2 loses its context after the first group of leases.
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	finishHook = func(step string) error {
		if step == "ended" {
			cancel()
		}
		return nil
	}
	lower := plan
	lower.Counters = map[string]uint64{}
	for k := range plan.Counters {
		lower.Counters[k] = floor - 10
	}
	res2, err := recOpenClosed(t, c, prefix).Finish(ctx, lower)
	if err == nil || res2.Raised != 0 || len(res2.Revoked) != endGroup {
		t.Fatalf("run 2: %+v %v", res2, err)
	}
	_, err = s.Acquire(bg, recAcquire("held-0", "between-runs", time.Hour))
	mustCode(t, "acquire between runs", err, lease.CodeBackendUnavailable)
	for k := range plan.Counters {
		if n, _ := (faults{s}).Counter(bg, k); n != floor {
			t.Fatalf("counter %d between runs, want %d (never lowered)", n, floor)
		}
	}
	finishHook = nil
	cn := recOpenClosed(t, c, prefix)
	st, err := cn.State(bg)
	if err != nil || len(st.Active) != 20-endGroup {
		t.Fatalf("state before run 3: %d active, %v", len(st.Active), err)
	}
	res3, err := cn.Finish(bg, plan)
	if err != nil || res3.Raised != 0 || len(res3.Revoked) != 20-endGroup {
		t.Fatalf("run 3: %+v %v", res3, err)
	}
	ended := append(slices.Clone(res2.Revoked), res3.Revoked...)
	slices.Sort(ended)
	var want []string
	for _, l := range leases {
		want = append(want, l.LeaseID)
	}
	slices.Sort(want)
	if !slices.Equal(ended, want) {
		t.Fatalf("leases ended over the runs %v, want each of %v once", ended, want)
	}
	for i, l := range leases {
		hist, err := s.History(bg, lease.HistoryRequest{Identity: l.Identity(), DeadlineAt: recFar(), Caller: recCaller})
		if err != nil || len(hist.Entries) != 1 || hist.Entries[0].Record.State != lease.StateRevoked {
			t.Fatalf("history of lease %d: %+v %v", i, hist, err)
		}
	}
	next, err := s.Acquire(bg, recAcquire("held-0", "after", time.Hour))
	if err != nil || next.Lease.FencingToken != floor+1 {
		t.Fatalf("acquire after recovery: %+v %v", next, err)
	}
	if v := keysOf(t, s)[s.keys.epoch()]; !strings.HasPrefix(v, string(u64(7))+"@") {
		t.Fatalf("epoch %q", v)
	}
}

// A restore that stops part-way leaves the prefix closed as restoring:
// mutations, recovery, a seal, a backup and another restore are refused.
// Once the prefix is emptied, the restore runs again, in many bounded
// transactions, and the prefix then holds exactly what the backup holds.
func testPartialRestore(t *testing.T, c *testenv.EtcdCluster) {
	src := open(t, c, Options{ReapInterval: -1})
	for i := range 30 {
		res, err := src.Acquire(bg, recAcquire(fmt.Sprintf("p-%d", i), fmt.Sprintf("acq-%d", i), time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := src.Release(bg, recRelease(res.Lease, fmt.Sprintf("rel-%d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	var b bytes.Buffer
	if _, err := src.Backup(bg, &b); err != nil {
		t.Fatal(err)
	}
	kv := payloadOf(t, b.Bytes())
	if len(kv) < 4*restoreBatchKeys {
		t.Fatalf("backup of %d keys: too few for several batches", len(kv))
	}
	prefix := randomPrefix()
	defer func() { restoreHook = nil }()
	restoreHook = func(batch int) error {
		if batch == 2 {
			return errors.New("crash")
		}
		return nil
	}
	_, err := recNamespace(t, c, prefix).Restore(bg, bytes.NewReader(b.Bytes()))
	mustCode(t, "restore stopped part-way", err, lease.CodeBackendUnavailable)
	restoreHook = nil
	dst := open(t, c, Options{KeyPrefix: prefix, ReapInterval: -1})
	if got := len(keysOf(t, dst)); got != 2*restoreBatchKeys+3 {
		t.Fatalf("a restore stopped at its third batch holds %d keys", got)
	}
	_, err = dst.Acquire(bg, recAcquire("p-1", "too-early", time.Hour))
	mustCode(t, "acquire in a part-way restore", err, lease.CodeBackendUnavailable)
	if !strings.Contains(err.Error(), "part-way") {
		t.Fatalf("the refusal does not say why: %v", err)
	}
	if _, err := recNamespace(t, c, prefix).OpenClosed(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("recovery of a part-way restore: %v", err)
	}
	if _, err := recNamespace(t, c, prefix).Seal(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("seal of a part-way restore: %v", err)
	}
	if _, err := dst.Backup(bg, io.Discard); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("backup of a part-way restore: %v", err)
	}
	if _, err := recNamespace(t, c, prefix).Restore(bg, bytes.NewReader(b.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("restore over a part-way restore: %v", err)
	}
	if _, err := dst.cli.Delete(bg, dst.keys.p, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := recNamespace(t, c, prefix).Restore(bg, bytes.NewReader(b.Bytes())); err != nil {
		t.Fatalf("restore into the emptied prefix: %v", err)
	}
	got := keysOf(t, dst)
	for k, v := range kv {
		if g, ok := got[dst.keys.p+k]; !ok || !strings.HasPrefix(g, string(v)+"@") {
			t.Fatalf("restored key %q: %q, want %q", k, g, v)
		}
	}
	// The backup's keys, and the gate and marker.
	if len(got) != len(kv)+2 || !strings.HasPrefix(got[dst.keys.gate()], gateRestored+"@") {
		t.Fatalf("restored prefix holds %d keys, backup %d; gate %q", len(got), len(kv), got[dst.keys.gate()])
	}
}

// Backups of a prefix without a store or with a malformed counter, and
// restores of a tampered or malformed backup, are refused, and a refused
// restore writes nothing.
func testRefusals(t *testing.T, c *testenv.EtcdCluster) {
	missing := randomPrefix()
	if _, err := recNamespace(t, c, missing).Backup(bg, io.Discard); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("backup of a prefix without a store: %v", err)
	}
	if _, err := recNamespace(t, c, missing).Seal(bg); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("seal of a prefix without a store: %v", err)
	}
	probe := open(t, c, Options{KeyPrefix: randomPrefix(), ReapInterval: -1})
	if r, err := probe.cli.Get(bg, missing+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("a refused backup wrote into the prefix (%d keys, %v)", r.Count, err)
	}

	src := open(t, c, Options{ReapInterval: -1})
	if _, err := src.Acquire(bg, recAcquire("r", "acq-r", time.Hour)); err != nil {
		t.Fatal(err)
	}
	var good bytes.Buffer
	h, err := src.Backup(bg, &good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.cli.Put(bg, src.keys.counter(recLockKey(t, "r")), "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Backup(bg, io.Discard); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("backup of a malformed counter: %v", err)
	}
	if _, err := src.cli.Put(bg, src.keys.p+"zz/other", "x"); err != nil {
		t.Fatal(err)
	}

	lk := recLockKey(t, "r")
	line := func(k string, v []byte) string {
		b, _ := json.Marshal(entry{Key: []byte(k), Value: v})
		return string(b)
	}
	schema := line("meta/schema", []byte(schemaVersion))
	counter := line("c/"+lk, u64(3))
	payloads := map[string]string{
		"unknown family":     line("a/"+lk, []byte("{}")) + "\n" + schema + "\n" + line("zz/other", nil),
		"short counter":      line("c/"+lk, []byte{1, 2, 3}) + "\n" + schema,
		"counter past limit": line("c/"+lk, u64(lease.MaxFencingToken+1)) + "\n" + schema,
		"foreign lock key":   line("c/elsewhere", u64(1)) + "\n" + schema,
		"out of order":       schema + "\n" + counter,
		"twice":              counter + "\n" + counter + "\n" + schema,
		"gate":               counter + "\n" + line("meta/gate", []byte("x")) + "\n" + schema,
		"audit":              line("audit/1", []byte("x")) + "\n" + counter + "\n" + schema,
		"no schema":          counter,
		"another schema":     counter + "\n" + line("meta/schema", []byte("2")),
		"unknown field":      `{"key":"Yy8=","value":"AAAAAAAAAAM=","extra":1}` + "\n" + schema,
		"not json":           "counter 3\n" + schema,
	}
	dst := open(t, c, Options{KeyPrefix: randomPrefix(), ReapInterval: -1})
	target := NewNamespace(Options{Client: dst.cli, KeyPrefix: dst.keys.p[:len(dst.keys.p)-1]})
	defer target.Close()
	before := keysOf(t, dst)
	for name, p := range payloads {
		var b bytes.Buffer
		if _, err := backupfile.Write(&b, backupfile.Header{Backend: BackendName, CreatedAt: time.Now()},
			func(w io.Writer) error { _, err := io.WriteString(w, p+"\n"); return err }); err != nil {
			t.Fatal(err)
		}
		if _, err := target.Restore(bg, &b); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("%s: restore answered %v", name, err)
		}
	}
	tampered := slices.Clone(good.Bytes())
	tampered[len(tampered)-3] ^= 1
	if _, err := target.Restore(bg, bytes.NewReader(tampered)); !errors.Is(err, backupfile.ErrChecksum) {
		t.Fatalf("tampered backup: %v", err)
	}
	var other bytes.Buffer
	if _, err := backupfile.Write(&other, backupfile.Header{Backend: "valkey", CreatedAt: time.Now()},
		func(w io.Writer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := target.Restore(bg, &other); !errors.Is(err, backupfile.ErrBackend) {
		t.Fatalf("another backend's backup: %v", err)
	}
	if after := keysOf(t, dst); !mapsEqual(before, after) {
		t.Fatal("a refused restore wrote into the prefix")
	}
	// The good backup still restores.
	if r, err := target.Restore(bg, bytes.NewReader(good.Bytes())); err != nil || r.PayloadSHA256 != h.PayloadSHA256 {
		t.Fatalf("restore: %+v %v", r, err)
	}
}

// A revision compacted while a backup reads it fails the backup (it would
// otherwise mix revisions); the next backup succeeds.
func testCompactedBackup(t *testing.T, c *testenv.EtcdCluster) {
	s := open(t, c, Options{ReapInterval: -1})
	for i := range 5 {
		if _, err := s.Acquire(bg, recAcquire(fmt.Sprintf("k-%d", i), fmt.Sprintf("acq-%d", i), time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	compacted := false
	scanPage, scanHook = 2, func() {
		if compacted {
			return
		}
		compacted = true
		if _, err := s.Acquire(bg, recAcquire("k-new", "acq-new", time.Hour)); err != nil {
			t.Error(err)
		}
		r, err := s.cli.Get(bg, s.keys.schema())
		if err == nil {
			_, err = s.cli.Compact(bg, r.Header.Revision, clientv3.WithCompactPhysical())
		}
		if err != nil {
			t.Error(err)
		}
	}
	defer func() { scanPage, scanHook = 256, nil }()
	_, err := s.Backup(bg, io.Discard)
	mustCode(t, "backup across a compaction", err, lease.CodeBackendUnavailable)
	if !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("the failure does not say why: %v", err)
	}
	h, err := s.Backup(bg, io.Discard)
	if err != nil || h.Counts["counter"] != 6 {
		t.Fatalf("backup after the compaction: %+v %v", h, err)
	}
}

// Backup, restore and recovery need nothing beyond the documented
// permission (read-write on the prefix): as that user, a backup of one
// granted prefix restores into another, carrying the credentials but not
// the audit stream, and recovery reopens it. A restore into a prefix the
// user may not write is refused, with nothing written.
func TestRecoveryLeastPrivilege(t *testing.T) {
	a := startPrivilegeCluster(t)
	srcOpts := a.options(t, Options{ReapInterval: -1})
	src := open(t, a.c, srcOpts)
	key, cred := credIssue(t, src.CredentialStore())
	held, err := src.Acquire(bg, recAcquire("lp", "acq-lp", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	sink := src.AuditSink(AuditOptions{})
	if err := sink.Write(bg, auditEvent(audit.EventAcquire, time.Now())); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	h, err := NewNamespace(srcOpts).Backup(bg, &b)
	if err != nil {
		t.Fatal(err)
	}
	if h.Counts["credential"] != 1 || h.Counts["counter"] != 1 {
		t.Fatalf("manifest %+v", h)
	}

	denied := srcOpts
	denied.KeyPrefix = randomPrefix() // never granted
	if _, err := NewNamespace(denied).Restore(bg, bytes.NewReader(b.Bytes())); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("restore into a prefix the user may not write: %v", err)
	}
	if r, err := a.root.Get(bg, denied.KeyPrefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("a refused restore wrote %d keys (%v)", r.Count, err)
	}

	dstOpts := a.options(t, Options{ReapInterval: -1})
	ns := NewNamespace(dstOpts)
	defer ns.Close()
	if _, err := ns.Restore(bg, bytes.NewReader(b.Bytes())); err != nil {
		t.Fatal(err)
	}
	cn, err := ns.OpenClosed(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	st, err := cn.State(bg)
	if err != nil || st.Counters[held.Lease.LockKey] != 1 || len(st.Active) != 1 {
		t.Fatalf("state: %+v %v", st, err)
	}
	if res, err := cn.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: 100}, Floor: 100, Epoch: 1, Reason: "lp"}); err != nil ||
		!slices.Equal(res.Revoked, []string{held.Lease.LeaseID}) {
		t.Fatalf("finish: %+v %v", res, err)
	}
	dst := open(t, a.c, dstOpts)
	// The key issued before the backup authenticates against the restored
	// prefix.
	authn, err := auth.NewAuthenticator(dst.CredentialStore(), credPepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := authn.Authenticate(bg, []string{"Bearer " + key}); err != nil || p.CredentialID != cred.ID {
		t.Fatalf("the restored credential: %+v %v", p, err)
	}
	events, err := dst.AuditSink(AuditOptions{}).Read(bg, audit.Filter{}, audit.MaxReadLimit)
	if err != nil || len(events) != 0 {
		t.Fatalf("the restored prefix holds %d audit events (%v); the stream is not carried", len(events), err)
	}
	next, err := dst.Acquire(bg, recAcquire("lp", "acq-next", time.Hour))
	if err != nil || next.Lease.FencingToken != 101 {
		t.Fatalf("acquire after recovery: %+v %v", next, err)
	}
}
