package valkey

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// Every mutation of a closed namespace is refused with
// backend_unavailable and changes nothing; reads go on; Health says why.
func TestClosedNamespaceRefusesMutations(t *testing.T) {
	r := sharedServer(t)
	s := open(t, r, Options{})
	id, other := newIdentity(), newIdentity()
	held, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := get(t, s, s.keys.active(tagOf(held.Lease.LockKey)))
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	if h := s.Health(bg); h.Status != lease.HealthDegraded || !strings.Contains(h.Reason, "failed over") {
		t.Fatalf("health of a sealed namespace: %+v", h)
	}
	_, err = s.Acquire(bg, acquireReq(other))
	mustCode(t, err, lease.CodeBackendUnavailable)
	_, err = s.Renew(bg, renewReq(held.Lease))
	mustCode(t, err, lease.CodeBackendUnavailable)
	_, err = s.Release(bg, releaseReq(held.Lease))
	mustCode(t, err, lease.CodeBackendUnavailable)
	_, err = s.Revoke(bg, adminReq(held.Lease))
	mustCode(t, err, lease.CodeBackendUnavailable)
	_, err = s.AuthorizeCommit(bg, commitReq(held.Lease))
	mustCode(t, err, lease.CodeBackendUnavailable)
	err = s.OutboxDone(bg, "msg_1")
	mustCode(t, err, lease.CodeBackendUnavailable)
	if !strings.Contains(err.Error(), "failed over") {
		t.Fatalf("refusal does not say why: %v", err)
	}
	// A replay is a mutation too: refused, not answered.
	_, err = s.Acquire(bg, acquireReq(id))
	mustCode(t, err, lease.CodeBackendUnavailable)
	if err := s.expireIfCurrent(bg, held.Lease.LockKey, held.Lease.LeaseID, held.Lease.FencingToken); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("the reaper ran in a closed namespace: %v", err)
	}
	after, _ := get(t, s, s.keys.active(tagOf(held.Lease.LockKey)))
	if after != before {
		t.Fatal("a refused mutation changed the active record")
	}
	if _, ok := get(t, s, s.keys.counter(tagOf(lockKey(t, other)))); ok {
		t.Fatal("a refused acquire created a counter")
	}
	ins, err := s.Inspect(bg, lease.InspectRequest{Identity: id, Caller: owner, DeadlineAt: far()})
	if err != nil || ins.Lease == nil || ins.Lease.LeaseID != held.Lease.LeaseID {
		t.Fatalf("read of a closed namespace: %+v %v", ins, err)
	}
	// A backup does not run over a closed namespace.
	if _, err := s.Backup(bg, &bytes.Buffer{}); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("backup of a closed namespace: %v", err)
	}
}

// closedState opens the closed namespace of o for recovery and reads it.
func closedState(t *testing.T, o Options) (lease.ClosedNamespace, lease.RestoredState) {
	t.Helper()
	c, err := NewNamespace(o).OpenClosed(bg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st, err := c.State(bg)
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// The epoch path on a sealed namespace (failover): counters raised, the
// floor above every counter, live leases revoked through the archive path,
// the namespace reopened, and a stale holder cannot commit.
func TestSealAndRecover(t *testing.T) { sealAndRecover(t, Options{KeyPrefix: randomPrefix()}) }

// TestSealAndRecoverReferringEvidence runs it on a namespace in format 5.
func TestSealAndRecoverReferringEvidence(t *testing.T) {
	sealAndRecover(t, Options{KeyPrefix: randomPrefix(), ReferringEvidence: true})
}

// TestSealAndRecoverLeanRecords runs it on a namespace in format 6.
func TestSealAndRecoverLeanRecords(t *testing.T) {
	sealAndRecover(t, Options{KeyPrefix: randomPrefix(), LeanRecords: true})
}

// TestSealAndRecoverLeanEvidence runs it on a namespace in format 7.
func TestSealAndRecoverLeanEvidence(t *testing.T) {
	sealAndRecover(t, Options{KeyPrefix: randomPrefix(), LeanEvidence: true})
}

// TestSealAndRecoverCheckedEvidence runs it on a namespace in format 8.
func TestSealAndRecoverCheckedEvidence(t *testing.T) {
	sealAndRecover(t, Options{KeyPrefix: randomPrefix(), CheckedEvidence: true})
}

// TestSealAndRecoverEmbeddedEvidence runs it on a namespace in format 4.
func TestSealAndRecoverEmbeddedEvidence(t *testing.T) {
	sealAndRecover(t, Options{KeyPrefix: randomPrefix(), EmbeddedEvidence: true})
}

func sealAndRecover(t *testing.T, o Options) {
	r := sharedServer(t)
	s := open(t, r, o)
	id := newIdentity()
	held, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewNamespace(Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1}).OpenClosed(bg); !errors.Is(err, ErrNamespaceOpen) {
		t.Fatalf("OpenClosed on an open namespace: %v", err)
	}
	o.Addr, o.ReapInterval = r.Addr(), -1
	c, st := closedState(t, o)
	if st.Counters[held.Lease.LockKey] != held.Lease.FencingToken || len(st.Active) != 1 || st.Active[0].LeaseID != held.Lease.LeaseID {
		t.Fatalf("state: %+v", st)
	}
	const floor = 1000 + 1_000_000
	res, err := c.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: floor}, Epoch: 1, Floor: floor,
		Reason: "failover epoch"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Raised != 1 || len(res.Revoked) != 1 || res.Revoked[0] != held.Lease.LeaseID {
		t.Fatalf("finish: %+v", res)
	}
	if h := s.Health(bg); h.Status != lease.HealthOK {
		t.Fatalf("health after recovery: %+v", h)
	}
	_, err = s.AuthorizeCommit(bg, commitReq(held.Lease))
	mustCode(t, err, lease.CodeLost)
	hist, err := s.History(bg, lease.HistoryRequest{Identity: id, Caller: owner, DeadlineAt: far()})
	if err != nil || len(hist.Entries) != 1 || hist.Entries[0].Record.State != lease.StateRevoked ||
		hist.Entries[0].EndedBy != lease.RecoveryPrincipal || hist.Entries[0].Reason != "failover epoch" {
		t.Fatalf("history after recovery: %+v %v", hist, err)
	}
	again, err := s.Acquire(bg, acquireReq(id))
	if err != nil || again.Lease.FencingToken != floor+1 {
		t.Fatalf("acquire after recovery: %+v %v", again, err)
	}
	// The floor holds for identities recovery never saw.
	fresh, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil || fresh.Lease.FencingToken != floor+1 {
		t.Fatalf("acquire of a new identity after recovery: %+v %v", fresh, err)
	}
	if v, _ := get(t, s, s.keys.epoch()); v != "1" {
		t.Fatalf("epoch %q", v)
	}
	// Recovery steps refuse to run on an open namespace.
	if _, err := c.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: floor + 5}}); err == nil {
		t.Fatal("Finish ran on a reopened namespace")
	}
}

// A backup restored into an empty namespace keeps everything recovery
// needs (counters, evidence, history, marks, active records), refuses
// work until recovery reopens it, and then replays pre-backup requests
// with their original results.
func TestBackupRestore(t *testing.T) { backupRestore(t, Options{}) }

// TestBackupRestoreReferringEvidence runs it on a namespace in format 5.
func TestBackupRestoreReferringEvidence(t *testing.T) {
	backupRestore(t, Options{ReferringEvidence: true})
}

// TestBackupRestoreLeanRecords runs it on a namespace in format 6.
func TestBackupRestoreLeanRecords(t *testing.T) {
	backupRestore(t, Options{LeanRecords: true})
}

// TestBackupRestoreLeanEvidence runs it on a namespace in format 7.
func TestBackupRestoreLeanEvidence(t *testing.T) {
	backupRestore(t, Options{LeanEvidence: true})
}

// TestBackupRestoreCheckedEvidence runs it on a namespace in format 8.
func TestBackupRestoreCheckedEvidence(t *testing.T) {
	backupRestore(t, Options{CheckedEvidence: true})
}

// TestBackupRestoreEmbeddedEvidence runs it on a namespace in format 4.
func TestBackupRestoreEmbeddedEvidence(t *testing.T) {
	backupRestore(t, Options{EmbeddedEvidence: true})
}

func backupRestore(t *testing.T, srcOpts Options) {
	r := sharedServer(t)
	src := open(t, r, srcOpts)
	id, id2 := newIdentity(), newIdentity()
	req := acquireReq(id)
	first, err := src.Acquire(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	cr := commitReq(first.Lease)
	if _, err := src.AuthorizeCommit(bg, cr); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	second, err := src.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	live, err := src.Acquire(bg, acquireReq(id2))
	if err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	h, err := src.Backup(bg, &backup)
	if err != nil {
		t.Fatal(err)
	}
	if h.Backend != BackendName || h.Counts["counter"] != 2 || h.Counts["active"] != 2 {
		t.Fatalf("manifest: %+v", h)
	}
	if v, _ := get(t, src, src.keys.gate()); v != "" {
		t.Fatal("the backup left the namespace closed")
	}
	// Work continues on the source after the backup.
	if _, err := src.Release(bg, releaseReq(second.Lease)); err != nil {
		t.Fatal(err)
	}

	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1, StoreOptions: src.opts}
	dst := open(t, r, o)
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	// Restored, closed: a replay is refused until recovery has run.
	_, err = dst.Acquire(bg, req)
	mustCode(t, err, lease.CodeBackendUnavailable)
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("second restore into the same namespace: %v", err)
	}
	c, st := closedState(t, o)
	if st.Marker.BackupSHA256 != h.PayloadSHA256 || st.Counters[first.Lease.LockKey] != second.Lease.FencingToken ||
		st.HighWater[first.Lease.LockKey] != first.Lease.FencingToken || len(st.Active) != 2 {
		t.Fatalf("restored state: %+v", st)
	}
	res, err := c.Finish(bg, lease.RecoveryPlan{Reason: "restored"})
	if err != nil || len(res.Revoked) != 2 {
		t.Fatalf("finish: %+v %v", res, err)
	}
	// The replay returns the original result, with the lease's state now.
	rep, err := dst.Acquire(bg, req)
	if err != nil || rep.Lease.LeaseID != first.Lease.LeaseID || rep.Lease.FencingToken != first.Lease.FencingToken ||
		rep.Current == nil || rep.Current.State != lease.StateReleased {
		t.Fatalf("replay after restore: %+v %v", rep, err)
	}
	// The commit evidence and the sink's mark came along.
	rc, err := dst.AuthorizeCommit(bg, cr)
	if err != nil || !rc.Replayed {
		t.Fatalf("commit replay after restore: %+v %v", rc, err)
	}
	// The restored live lease was revoked, never resurrected.
	_, err = dst.Renew(bg, renewReq(live.Lease))
	mustCode(t, err, lease.CodeLost)
	next, err := dst.Acquire(bg, acquireReq(id))
	if err != nil || next.Lease.FencingToken != second.Lease.FencingToken+1 {
		t.Fatalf("acquire after restore: %+v %v", next, err)
	}
}

// A restore refuses a namespace that holds anything, and a backup whose
// payload breaks the layout, and restores nothing then.
func TestRestoreRefusals(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{})
	if _, err := src.Acquire(bg, acquireReq(newIdentity())); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Restore(bg, bytes.NewReader(backup.Bytes())); !errors.Is(err, ErrRestoreTarget) {
		t.Fatalf("restore over a live namespace: %v", err)
	}
	if _, err := src.Restore(bg, bytes.NewReader(backup.Bytes())); !errors.Is(err, backupfile.ErrRestoreTarget) {
		t.Fatalf("restore over a live namespace, as any backend's refusal: %v", err)
	}
	if v, _ := get(t, src, src.keys.gate()); v != "" {
		t.Fatal("a refused restore left the namespace closed")
	}
	tampered := bytes.Replace(backup.Bytes(), []byte(`"counter"`), []byte(`"counter"`), 1)
	tampered[len(tampered)-3] ^= 1
	dst := open(t, r, Options{})
	if _, err := dst.Restore(bg, bytes.NewReader(tampered)); !errors.Is(err, backupfile.ErrChecksum) {
		t.Fatalf("tampered backup: %v", err)
	}
	for name, line := range map[string]string{
		"unknown key":       `{"key":"elsewhere","type":"string","string":"eA=="}`,
		"counter not text":  `{"key":"{` + strings.Repeat("a", 43) + `}:counter","type":"string","string":"LTE="}`,
		"counter as a list": `{"key":"{` + strings.Repeat("a", 43) + `}:counter","type":"list","list":["MQ=="]}`,
		"unknown field":     `{"key":"epoch","type":"string","string":"MQ==","extra":1}`,
	} {
		var b bytes.Buffer
		if _, err := backupfile.Write(&b, backupfile.Header{Backend: BackendName, CreatedAt: time.Now()},
			func(w io.Writer) error { _, err := w.Write([]byte(line + "\n")); return err }); err != nil {
			t.Fatal(err)
		}
		if _, err := dst.Restore(bg, &b); err == nil {
			t.Fatalf("%s: restored", name)
		}
	}
	keys, err := dst.scanKeys(context.Background(), "*")
	if err != nil || len(keys) != 0 {
		t.Fatalf("a refused restore wrote %v (%v)", keys, err)
	}
}

// recoveryCommands are the commands the recovery tools need beyond the
// service's ACL, as valkey/doc.go lists them.
const recoveryCommands = "+scan +pexpiretime +hgetall +zrange +rpush +hset +pexpireat"

// Backup, restore and recovery work under the documented ACL plus the
// documented recovery commands, and the service's own ACL cannot back up.
func TestRecoveryUnderACL(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(strings.ReplaceAll(string(src), "//", "")), " "), recoveryCommands) {
		t.Fatalf("doc.go does not list the recovery commands %q", recoveryCommands)
	}
	operator := strings.Replace(documentedACL(t, "operator-secret"), "user starlease", "user operator", 1) + " " + recoveryCommands
	r, pw := aclServer(t, operator)
	opw := filepath.Join(t.TempDir(), "operator")
	if err := os.WriteFile(opw, []byte("operator-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease"})
	held, err := svc.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Backup(bg, &bytes.Buffer{}); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("backup with the service's ACL: %v", err)
	}
	if _, err := svc.Acquire(bg, acquireReq(newIdentity())); err != nil {
		t.Fatalf("a refused backup left the namespace closed: %v", err)
	}
	op := open(t, r, Options{Username: "operator", PasswordFile: opw, KeyPrefix: "starlease"})
	var backup bytes.Buffer
	if _, err := op.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	// The new server: its operator shares the service's password file.
	fresh, _ := aclServer(t, strings.Replace(operator, "operator-secret", "lease-secret", 1))
	dst := open(t, fresh, Options{Username: "operator", PasswordFile: pw, KeyPrefix: "starlease"})
	if _, err := dst.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	c, err := NewNamespace(Options{Addr: fresh.Addr(), Username: "operator", PasswordFile: pw, KeyPrefix: "starlease", ReapInterval: -1}).OpenClosed(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.State(bg); err != nil {
		t.Fatal(err)
	}
	res, err := c.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: 100}, Floor: 100, Epoch: 1, Reason: "acl"})
	if err != nil || len(res.Revoked) != 2 || !slices.Contains(res.Revoked, held.Lease.LeaseID) {
		t.Fatalf("finish under ACL: %+v %v", res, err)
	}
	svc2 := open(t, fresh, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease"})
	next, err := svc2.Acquire(bg, acquireReq(held.Lease.Identity()))
	if err != nil || next.Lease.FencingToken != 101 {
		t.Fatalf("acquire after recovery under ACL: %+v %v", next, err)
	}
}

// BenchmarkBackup measures a backup of a namespace of 1000 identities
// (each with its counter, active record, idempotency evidence and lookup
// key): the pause of mutations a backup takes.
func BenchmarkBackup(b *testing.B) {
	r := testenv.StartRedis(b)
	s := open(b, r, Options{})
	for i := 0; i < 1000; i++ {
		if _, err := s.Acquire(bg, acquireReq(newIdentity())); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var keys int64
	for i := 0; i < b.N; i++ {
		h, err := s.Backup(bg, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		keys = 0
		for _, n := range h.Counts {
			keys += n
		}
	}
	b.ReportMetric(float64(keys), "keys")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "pause_ms")
}

// A backup whose context ends while it reads still reopens the namespace.
func TestCancelledBackupReopens(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	for i := 0; i < 200; i++ {
		if _, err := s.Acquire(bg, acquireReq(newIdentity())); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(bg)
	// Cancelled by the first key type read: after the gate closed.
	s.backupHook = cancel
	if _, err := s.Backup(ctx, io.Discard); err == nil {
		t.Fatal("a cancelled backup succeeded")
	}
	s.backupHook = nil
	if v, ok := get(t, s, s.keys.gate()); ok {
		t.Fatalf("a cancelled backup left the namespace closed: %q", v)
	}
	if _, err := s.Acquire(bg, acquireReq(newIdentity())); err != nil {
		t.Fatalf("acquire after a cancelled backup: %v", err)
	}
}

// A restore that stopped part-way stays closed as "restoring", which
// recovery refuses: its counters could be missing, and recovery would keep
// them as they are.
func TestPartialRestoreIsNotRecoverable(t *testing.T) {
	r := sharedServer(t)
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1}
	s := open(t, r, o)
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.gate()).Value(gateRestoring+":{}").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(bg, acquireReq(newIdentity())); lease.CodeOf(err) != lease.CodeBackendUnavailable ||
		!strings.Contains(err.Error(), "part-way") {
		t.Fatalf("acquire in a part-way restore: %v", err)
	}
	if _, err := NewNamespace(o).OpenClosed(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("recovery of a part-way restore: %v", err)
	}
}

// A recovery whose namespace was reopened and closed again by someone else
// (here a failover seal) cannot act under that other closing: it raises no
// counter and ends no lease acquired after the reopening.
func TestStaleRecoveryCannotAct(t *testing.T) {
	r := sharedServer(t)
	o := Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), ReapInterval: -1}
	s := open(t, r, o)
	id := newIdentity()
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	first, _ := closedState(t, o)
	stale, _ := closedState(t, o)
	if _, err := first.Finish(bg, lease.RecoveryPlan{Reason: "first"}); err != nil {
		t.Fatal(err)
	}
	held, err := s.Acquire(bg, acquireReq(id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seal(bg); err != nil {
		t.Fatal(err)
	}
	res, err := stale.Finish(bg, lease.RecoveryPlan{Counters: map[string]uint64{held.Lease.LockKey: 1000}, Reason: "stale"})
	if err == nil || res.Raised != 0 || len(res.Revoked) != 0 {
		t.Fatalf("stale recovery: %+v %v", res, err)
	}
	if v, _ := get(t, s, s.keys.counter(tagOf(held.Lease.LockKey))); v != "1" {
		t.Fatalf("a stale recovery raised the counter to %q", v)
	}
	ins, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
	if err != nil || ins.Lease == nil || ins.Lease.LeaseID != held.Lease.LeaseID {
		t.Fatalf("a stale recovery ended a lease acquired after the reopening: %+v %v", ins, err)
	}
}

// A counter, counter floor or high-water mark that is not a decimal of at
// most 16 digits fails closed as corrupt, and the acquisition or commit
// changes nothing.
func TestMalformedCountersFailClosed(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	set := func(key, v string) {
		t.Helper()
		if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"12a", "-1", "12345678901234567", " 1"} {
		id := newIdentity()
		set(s.keys.counter(tagOf(lockKey(t, id))), bad)
		_, err := s.Acquire(bg, acquireReq(id))
		mustCode(t, err, lease.CodeCorrupt)
		if _, ok := get(t, s, s.keys.active(tagOf(lockKey(t, id)))); ok {
			t.Fatalf("counter %q: an active record was written", bad)
		}
	}
	held, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Hset().Key(s.keys.marks(tagOf(held.Lease.LockKey))).FieldValue().
		FieldValue("couchdb", "x1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = s.AuthorizeCommit(bg, commitReq(held.Lease))
	mustCode(t, err, lease.CodeCorrupt)
	// A malformed commit seq likewise: no mark raised, no evidence kept.
	other, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	otherTag := tagOf(other.Lease.LockKey)
	set(s.keys.commitSeq(otherTag), "7x")
	r := commitReq(other.Lease)
	_, err = s.AuthorizeCommit(bg, r)
	mustCode(t, err, lease.CodeCorrupt)
	if n, err := s.client.Do(bg, s.client.B().Exists().Key(s.keys.marks(otherTag)).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("a commit under a malformed commit seq raised the high-water mark (%d, %v)", n, err)
	}
	set(s.keys.counterFloor(), "1e9")
	id := newIdentity()
	_, err = s.Acquire(bg, acquireReq(id))
	mustCode(t, err, lease.CodeCorrupt)
	if _, ok := get(t, s, s.keys.counter(tagOf(lockKey(t, id)))); ok {
		t.Fatal("an acquisition under a malformed floor wrote a counter")
	}
}
