package bolt

// Review 4 attacks on schema 3 (the ident bucket) and evidence by
// reference (evidence.go): sequences of operations after which a replay
// must still answer exactly the original result, the reference marks and
// the expiry index must stay consistent, and the migration and the
// restore path must carry both forms.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// r4Call is one successful mutation and how to send it again.
type r4Call struct {
	name string
	redo func() (lease.Result, error)
	want lease.Result
}

// r4Book records successful mutations for later replays.
type r4Book struct {
	t     *testing.T
	s     *Store
	far   time.Time
	calls []r4Call
}

func (b *r4Book) note(name string, redo func() (lease.Result, error)) lease.Result {
	b.t.Helper()
	res, err := redo()
	if err != nil {
		b.t.Fatalf("%s: %v", name, err)
	}
	b.calls = append(b.calls, r4Call{name: name, redo: redo, want: res})
	return res
}

func (b *r4Book) acquire(reqID, target string, ttl time.Duration) lease.Result {
	req := acquireReq(reqID, ttl, b.far)
	req.Identity.TargetID = target
	req.Metadata = lease.Metadata{"attempt": reqID, "n": 7}
	return b.note("acquire "+reqID, func() (lease.Result, error) { return b.s.Acquire(context.Background(), req) })
}

func (b *r4Book) renew(reqID string, r *lease.Record, ttl time.Duration) lease.Result {
	req := lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, TTL: ttl,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: b.far, Caller: callerOfRecord(r)}}
	return b.note("renew "+reqID, func() (lease.Result, error) { return b.s.Renew(context.Background(), req) })
}

func (b *r4Book) release(reqID string, r *lease.Record) lease.Result {
	req := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: b.far, Caller: callerOfRecord(r)}}
	return b.note("release "+reqID, func() (lease.Result, error) { return b.s.Release(context.Background(), req) })
}

func (b *r4Book) admin(op lease.Op, reqID string, r *lease.Record) lease.Result {
	req := lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, Reason: "review four",
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: b.far, Caller: lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}}}
	return b.note(string(op)+" "+reqID, func() (lease.Result, error) {
		if op == lease.OpRevoke {
			return b.s.Revoke(context.Background(), req)
		}
		return b.s.ForceRelease(context.Background(), req)
	})
}

// replayAll sends every recorded mutation again: each must answer its
// original result exactly, from evidence.
func (b *r4Book) replayAll(step string) {
	b.t.Helper()
	for _, c := range b.calls {
		got, err := c.redo()
		if err != nil {
			b.t.Fatalf("after %s: replay of %s: %v (original answered %s)", step, c.name, err, c.want.Code)
		}
		if !got.Replayed || got.Code != c.want.Code || got.BackendTime != c.want.BackendTime ||
			encoded(b.t, got.Lease) != encoded(b.t, c.want.Lease) {
			b.t.Fatalf("after %s: replay of %s:\n got  %s %s\n want %s %s", step, c.name, got.Code, encoded(b.t, got.Lease),
				c.want.Code, encoded(b.t, c.want.Lease))
		}
		if got.Current != nil && got.Current.LeaseID != c.want.Lease.LeaseID {
			b.t.Fatalf("after %s: replay of %s reports another lease as current: %+v", step, c.name, got.Current)
		}
	}
	r4Invariants(b.t, b.s, step)
}

// r4Invariants checks the bookkeeping schema 3 relies on: every piece of
// evidence decodes, and the expiry index has exactly one entry per active
// record.
func r4Invariants(t *testing.T, s *Store, step string) {
	t.Helper()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if err := eachOfKind(readView(tx), kindIdem, func(lockKey string, _, v []byte) error {
			v1, known, ok := v1Evidence(tx, lockKey, v)
			if !known {
				// Evidence outlives its identity's records: with no tuple
				// to rebuild it, check at least that its lines are well
				// formed.
				if _, ok := lease.ExpandEvidence(string(v), lease.Identity{TenantID: "t", ProgramID: "p",
					TargetNamespace: "n", TargetID: "x", ActorName: "a", WorkflowName: "w", OperationClass: "o"}); !ok {
					t.Errorf("after %s: version 2 evidence is malformed: %q", step, v)
				}
				return nil
			}
			if !ok {
				t.Errorf("after %s: version 2 evidence does not expand: %q", step, v)
			}
			if _, err := lease.DecodeIdempotencyRecord(v1); err != nil {
				t.Errorf("after %s: evidence does not decode: %v", step, err)
			}
			return nil
		}); err != nil {
			return err
		}
		active := 0
		if err := eachOfKind(readView(tx), kindActive, func(string, []byte, []byte) error { active++; return nil }); err != nil {
			return err
		}
		if n := tx.Bucket(bucketActiveExp).Stats().KeyN; n != active {
			t.Errorf("after %s: %d expiry index entries for %d active records", step, n, active)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.ActiveLeases(context.Background())
	if err != nil || n != int64(kindLen(t, s, kindActive)) {
		t.Errorf("after %s: ActiveLeases %d %v, active records %d", step, n, err, kindLen(t, s, kindActive))
	}
}

// Every way a lease ends — release, lazy expiry of a renewal (lostExpired),
// force-release, revoke, the reaper's expiry, expiry found by a new
// acquire — with the same identity acquired again and again, history as
// short as one or two entries and shorter-lived than the evidence: every
// replay of every request answers exactly its original result at every
// step, and the marks and the expiry index stay consistent.
func TestReview4ReplaysThroughEveryEnding(t *testing.T) {
	for _, keep := range []int{1, 2} {
		t.Run(fmt.Sprint("history", keep), func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryPerIdentity, o.HistoryRetention = keep, time.Hour
			s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
			b := &r4Book{t: t, s: s, far: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
			const target = "t4"
			other := b.acquire("acq-other", "t4-other", time.Hour) // another identity, active throughout
			b.renew("ren-other", other.Lease, time.Hour)

			// L1: renewed many times, then released.
			l1 := b.acquire("acq-l1", target, time.Minute)
			cur := l1.Lease
			for i := range 5 {
				c.Add(time.Second)
				cur = b.renew(fmt.Sprint("ren-l1-", i), cur, time.Duration(30+i)*time.Second).Lease
				b.replayAll(fmt.Sprint("renewal ", i))
			}
			c.Add(time.Second)
			b.release("rel-l1", cur)
			b.replayAll("release of L1")

			// L2: a renewal after expiry archives it (lostExpired).
			l2 := b.acquire("acq-l2", target, time.Minute)
			b.renew("ren-l2", l2.Lease, time.Minute)
			c.Add(2 * time.Minute)
			if _, err := s.Renew(ctx, lease.RenewRequest{Identity: l2.Lease.Identity(), LeaseID: l2.Lease.LeaseID, FencingToken: l2.Lease.FencingToken,
				ServiceInstanceID: l2.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "ren-l2-late", DeadlineAt: b.far, Caller: callerOfRecord(l2.Lease)}}); code(err) != lease.CodeLost {
				t.Fatalf("late renewal: %v, want lease_lost", err)
			}
			b.replayAll("lazy expiry of L2")

			// L3: force-released; L4: renewed then revoked.
			l3 := b.acquire("acq-l3", target, time.Minute)
			b.admin(lease.OpForceRelease, "force-l3", l3.Lease)
			b.replayAll("force-release of L3")
			l4 := b.acquire("acq-l4", target, time.Minute)
			l4r := b.renew("ren-l4", l4.Lease, 2*time.Minute)
			b.admin(lease.OpRevoke, "revoke-l4", l4r.Lease)
			b.replayAll("revoke of L4")

			// L5: expired by the reaper.
			l5 := b.acquire("acq-l5", target, time.Minute)
			b.renew("ren-l5", l5.Lease, time.Minute)
			c.Add(2 * time.Minute)
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
			b.replayAll("reaper expiry of L5")

			// L6 expires and is archived by L7's acquire.
			l6 := b.acquire("acq-l6", target, time.Minute)
			b.renew("ren-l6", l6.Lease, time.Minute)
			c.Add(2 * time.Minute)
			l7 := b.acquire("acq-l7", target, time.Minute)
			b.replayAll("acquire over expired L6")
			b.release("rel-l7", l7.Lease)
			b.replayAll("release of L7")

			// History retention (1h) passes, evidence retention does not.
			for range 2 { // the other identity's lease expires during the first
				c.Add(90 * time.Minute)
				if err := s.reap(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := kindLen(t, s, kindHistory); got != 0 {
				t.Fatalf("history entries past retention: %d", got)
			}
			b.replayAll("history retention")

			// A changed retry of each kind still conflicts.
			ch := acquireReq("acq-l1", 2*time.Minute, b.far)
			ch.Identity.TargetID = target
			ch.Metadata = lease.Metadata{"attempt": "acq-l1", "n": 7}
			if _, err := s.Acquire(ctx, ch); code(err) != lease.CodeIdempotencyConflict {
				t.Fatalf("changed acquire retry: %v", err)
			}
			if _, err := s.Renew(ctx, lease.RenewRequest{Identity: l1.Lease.Identity(), LeaseID: l1.Lease.LeaseID, FencingToken: l1.Lease.FencingToken, TTL: time.Hour,
				ServiceInstanceID: l1.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "ren-l1-0", DeadlineAt: b.far, Caller: callerOfRecord(l1.Lease)}}); code(err) != lease.CodeIdempotencyConflict {
				t.Fatalf("changed renew retry: %v", err)
			}
			// Counters never went back.
			n := b.acquire("acq-l8", target, time.Minute)
			if n.Lease.FencingToken != 8 {
				t.Fatalf("token after seven leases: %d", n.Lease.FencingToken)
			}
			b.replayAll("acquire of L8")
		})
	}
}

// Evidence of a lease that is active at the backup and ended by recovery's
// Finish (revoked), then trimmed by later leases of the same identity:
// every replay answers its original result throughout, and the acquire's
// replay reports the terminal state while the history entry exists.
func TestReview4RestoreRecoveryThenReplay(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 1
	s, err := Open(filepath.Join(dir, "a.db"), Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := &r4Book{t: t, s: s, far: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	done := b.acquire("acq-done", "rr", time.Minute)
	b.release("rel-done", b.renew("ren-done", done.Lease, time.Minute).Lease)
	act := b.acquire("acq-act", "rr", time.Hour)
	c.Add(time.Second)
	b.renew("ren-act", act.Lease, time.Hour)
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	s.Close()

	target := filepath.Join(dir, "b.db")
	ns := NewNamespace(target, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan := lease.RecoveryPlan{Counters: map[string]uint64{}, Epoch: 1, Reason: "review four"}
	for k, v := range st.Counters {
		plan.Counters[k] = v + 10
	}
	if _, err := r.Finish(ctx, plan); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(target, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	b.s = s2
	b.replayAll("restore and recovery")
	ar, err := b.calls[3].redo() // acq-act
	if err != nil || ar.Current == nil || ar.Current.State != lease.StateRevoked {
		t.Fatalf("replayed acquire of the lease recovery ended: %v current %+v, want revoked", err, ar.Current)
	}
	// A new lease of the identity trims the revoked one (one entry kept).
	n := b.acquire("acq-new", "rr", time.Minute)
	if n.Lease.FencingToken <= act.Lease.FencingToken+10 {
		t.Fatalf("token after recovery: %d", n.Lease.FencingToken)
	}
	b.release("rel-new", n.Lease)
	b.replayAll("trim after recovery")
}

// A page token of an identity's history taken before the migration
// continues after it, and the first entry archived after the migration is
// the newest.
func TestReview4HistoryPageTokenAcrossMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	b := &r4Book{t: t, s: s, far: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	// Interleave two identities so the sequence is shared.
	var id lease.Identity
	for i := range 5 {
		for _, target := range []string{"pg-a", "pg-b"} {
			a := b.acquire(fmt.Sprint("acq-", target, i), target, time.Minute)
			b.renew(fmt.Sprint("ren-", target, i), a.Lease, time.Minute)
			b.release(fmt.Sprint("rel-", target, i), a.Lease)
			if target == "pg-a" {
				id = a.Lease.Identity()
			}
		}
	}
	p1, err := s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: 2, DeadlineAt: b.far})
	if err != nil || p1.NextPageToken == "" {
		t.Fatal(err)
	}
	want, err := s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: 50, PageToken: p1.NextPageToken, DeadlineAt: b.far})
	if err != nil || len(want.Entries) != 3 {
		t.Fatalf("page 2 before: %v %d", err, len(want.Entries))
	}
	s.Close()
	downgradeToV2(t, path)
	s, err = Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b.s = s
	b.replayAll("migration")
	got, err := s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: 50, PageToken: p1.NextPageToken, DeadlineAt: b.far})
	if err != nil || len(got.Entries) != len(want.Entries) {
		t.Fatalf("page 2 after migration: %v %d entries, want %d", err, len(got.Entries), len(want.Entries))
	}
	for i := range got.Entries {
		if got.Entries[i].Record.LeaseID != want.Entries[i].Record.LeaseID {
			t.Fatalf("page 2 entry %d after migration: %s, want %s", i, got.Entries[i].Record.LeaseID, want.Entries[i].Record.LeaseID)
		}
	}
	a := b.acquire("acq-after", "pg-a", time.Minute)
	b.release("rel-after", a.Lease)
	h, err := s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: 1, DeadlineAt: b.far})
	if err != nil || len(h.Entries) != 1 || h.Entries[0].Record.LeaseID != a.Lease.LeaseID {
		t.Fatalf("newest entry after migration: %v %+v, want %s", err, h.Entries, a.Lease.LeaseID)
	}
	b.replayAll("lease after migration")
}

// No other kind of an identity's keys falls under its history prefix, nor
// another identity's history under it.
func TestReview4HistoryPrefixIsExact(t *testing.T) {
	lk := "starintel:target-lease:v1:" + string(bytes.Repeat([]byte{'A'}, 43))
	lk2 := "starintel:target-lease:v1:" + string(bytes.Repeat([]byte{'A'}, 42)) + "B"
	for _, k := range [][]byte{historyKey(lk2, 1), idemKey(lk, "x"), activeKey(lk), counterKey(lk)} {
		if bytes.HasPrefix(k, historyPrefix(lk)) {
			t.Errorf("%q is under the history prefix", k)
		}
	}
}

// Many writers on few identities with the reaper running, history of one
// entry retired after a millisecond: afterwards every successful request
// replays exactly. Run with -race.
func TestReview4ConcurrentReplays(t *testing.T) {
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity, o.HistoryRetention = 1, time.Millisecond
	s := openTemp(t, Options{StoreOptions: o, ReapInterval: 2 * time.Millisecond})
	far := time.Now().Add(time.Hour)
	var mu sync.Mutex
	book := &r4Book{t: t, s: s, far: far}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ctx := context.Background()
			for i := range 40 {
				target := fmt.Sprint("cc-", (w+i)%3)
				req := acquireReq(fmt.Sprint("acq-", w, "-", i), time.Duration(5+i%7)*time.Millisecond, far)
				req.Identity.TargetID = target
				a, err := s.Acquire(ctx, req)
				if err != nil {
					continue
				}
				calls := []r4Call{{name: "acquire " + req.RequestID, redo: func() (lease.Result, error) { return s.Acquire(ctx, req) }, want: a}}
				r := a.Lease
				rn := lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, TTL: 10 * time.Millisecond,
					ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprint("ren-", w, "-", i), DeadlineAt: far, Caller: callerOfRecord(r)}}
				if res, err := s.Renew(ctx, rn); err == nil {
					calls = append(calls, r4Call{name: "renew " + rn.RequestID, redo: func() (lease.Result, error) { return s.Renew(ctx, rn) }, want: res})
				}
				if i%2 == 0 {
					rl := lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
						ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: fmt.Sprint("rel-", w, "-", i), DeadlineAt: far, Caller: callerOfRecord(r)}}
					if res, err := s.Release(ctx, rl); err == nil {
						calls = append(calls, r4Call{name: "release " + rl.RequestID, redo: func() (lease.Result, error) { return s.Release(ctx, rl) }, want: res})
					}
				}
				// Replays while others write.
				for _, c := range calls {
					got, err := c.redo()
					if err != nil || !got.Replayed || encoded(t, got.Lease) != encoded(t, c.want.Lease) {
						t.Errorf("concurrent replay of %s: %v", c.name, err)
					}
				}
				mu.Lock()
				book.calls = append(book.calls, calls...)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(book.calls) < 30 {
		t.Fatalf("only %d successful mutations: the attack did not run", len(book.calls))
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	book.replayAll("concurrent load")
}

// A damaged record of a lease (history entry or active record) costs the
// other requests of that lease nothing: their evidence is whole, so the
// renewal's retry still answers its original result.
func TestReview4DamagedRecordSparesOtherEvidence(t *testing.T) {
	for _, damage := range []string{"history_entry", "active_record"} {
		t.Run(damage, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
			b := &r4Book{t: t, s: s, far: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
			a := b.acquire("acq-dmg", "dmg", time.Minute)
			c.Add(time.Second)
			rn := b.renew("ren-dmg", a.Lease, time.Minute)
			renCall := b.calls[len(b.calls)-1]
			if damage == "history_entry" {
				c.Add(time.Second)
				b.release("rel-dmg", rn.Lease)
			}
			if err := s.db.Update(func(tx *bbolt.Tx) error {
				ident := tx.Bucket(bucketIdent)
				if damage == "active_record" {
					return ident.Put(activeKey(a.Lease.LockKey), []byte("{not a record"))
				}
				return eachOfKind(readView(tx), kindHistory, func(_ string, k, v []byte) error {
					bad := bytes.Clone(v)
					bad[len(bad)/2] ^= 0x20
					return ident.Put(bytes.Clone(k), bad)
				})
			}); err != nil {
				t.Fatal(err)
			}
			// The renewal's evidence itself is untouched.
			got, err := renCall.redo()
			if err != nil || !got.Replayed || encoded(t, got.Lease) != encoded(t, renCall.want.Lease) {
				t.Fatalf("replay of the renewal, whose own evidence is intact, after its lease's %s was damaged: %v", damage, err)
			}
		})
	}
}

// A backup of a schema 2 file (as the schema 2 code's Backup wrote it: the
// file's bytes) restores, migrates when recovery opens it, and recovery
// ends its active lease; every replay answers its original result after,
// also once a later lease trims the recovered one away.
func TestReview4RestoreSchema2Backup(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 1
	src := filepath.Join(dir, "v2.db")
	s, err := Open(src, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := &r4Book{t: t, s: s, far: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	done := b.acquire("acq-done", "v2r", time.Minute)
	b.release("rel-done", b.renew("ren-done", done.Lease, time.Minute).Lease)
	act := b.acquire("acq-act", "v2r", time.Hour)
	c.Add(time.Second)
	b.renew("ren-act", act.Lease, time.Hour)
	s.Close()
	downgradeToV2(t, src)
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := backupfile.Write(&buf, backupfile.Header{Backend: BackendName, CreatedAt: c.Now()},
		func(w io.Writer) error { _, err := w.Write(raw); return err }); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "restored.db")
	ns := NewNamespace(target, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if _, err := ns.Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("restore of a schema 2 backup: %v", err)
	}
	r, err := ns.OpenClosed(ctx)
	if err != nil {
		t.Fatalf("recovery open of a schema 2 backup: %v", err)
	}
	st, err := r.State(ctx)
	if err != nil || len(st.Active) != 1 || st.Counters[act.Lease.LockKey] != act.Lease.FencingToken {
		t.Fatalf("restored state: %v %+v", err, st)
	}
	if _, err := r.Finish(ctx, lease.RecoveryPlan{Counters: map[string]uint64{act.Lease.LockKey: 100}, Epoch: 1, Reason: "review four"}); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(target, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	b.s = s2
	b.replayAll("restore of a schema 2 backup")
	n := b.acquire("acq-new", "v2r", time.Minute)
	if n.Lease.FencingToken != 101 {
		t.Fatalf("token after recovery: %d, want 101", n.Lease.FencingToken)
	}
	b.release("rel-new", n.Lease)
	b.replayAll("trim after recovery")
}

// ActiveLeases counts active records, a corrupt one included: the reaper
// drops the expiry entry of a record corrupt at its expiry time while the
// record stays (quarantined, still blocking the identity). Found by review
// 4 when it counted expiry entries.
func TestReview4ActiveLeasesCountsACorruptActiveRecord(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a, err := s.Acquire(ctx, acquireReq("acq-cnt", time.Minute, far))
	if err != nil {
		t.Fatal(err)
	}
	if err := (faults{s}).PutRawActive(ctx, a.Lease.LockKey, []byte("{damaged")); err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Minute)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, acquireReq("acq-cnt-2", time.Minute, far)); code(err) != lease.CodeCorrupt {
		t.Fatalf("acquire over the damaged record: %v, want corrupt (the identity is still held)", err)
	}
	if n, err := s.ActiveLeases(ctx); err != nil || n != int64(kindLen(t, s, kindActive)) {
		t.Fatalf("ActiveLeases = %d (%v) with %d active record(s) in the store", n, err, kindLen(t, s, kindActive))
	}
}
