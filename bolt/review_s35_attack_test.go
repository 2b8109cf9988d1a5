package bolt

// Review attacks on the move of the store onto internal/layered views
// (c6a56bf): every function of a batch runs once on one writer view and a
// failing one is rolled back to its mark. The intent is no change in what
// the store stores, answers, or when it is durable. Each test fails if the
// guarantee it names breaks.
//
// s35Tx is the transaction type the store's functions take: the tests use
// only what *bbolt.Tx has too, so they run on the parent commit with the
// alias pointed at bbolt.Tx.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

type s35Tx = layered.View

var s35Far = time.Now().Add(24 * time.Hour)

// s35Batch runs calls so that every call's function shares one
// transaction of g, queued in the order given: a gate holds the committer
// while the calls queue, then lets them run. Each call is a blocking
// call that submits exactly one function to g.
func s35Batch(t *testing.T, g *groupCommit, calls ...func()) {
	t.Helper()
	release := make(chan struct{})
	first := gate(t, g, release)
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); call() }()
		waitQueued(t, g, i+1)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func s35Identity(n int) lease.Identity {
	id := testIdentity
	id.TargetID = fmt.Sprintf("s35-target-%d", n)
	return id
}

func s35LockKey(t *testing.T, id lease.Identity) string {
	t.Helper()
	return s30Holder{id: id}.lockKey(t)
}

func s35Acquire(ctx context.Context, s *Store, id lease.Identity, reqID string, ttl time.Duration) (lease.Result, error) {
	req := acquireReq(reqID, ttl, s35Far)
	req.Identity = id
	return s.Acquire(ctx, req)
}

// s35Dump is every key and value of every bucket of s (and each bucket's
// sequence), except the persisted clock and the engine's bookkeeping (its
// id and its log's, random per file, and the redo record the tree holds,
// which counts batches).
func s35Dump(t *testing.T, db *bbolt.DB) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			out[string(name)+"/#seq"] = fmt.Sprint(b.Sequence())
			return b.ForEach(func(k, v []byte) error {
				if bytes.Equal(name, bucketMeta) && (bytes.Equal(k, keyClock) || bytes.Equal(k, keyEngineID) || bytes.Equal(k, keyRedoApplied) || bytes.Equal(k, keyRedoLog)) {
					return nil
				}
				out[string(name)+"/"+fmt.Sprintf("%x", k)] = fmt.Sprintf("%x", v)
				return nil
			})
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func s35DiffDumps(a, b map[string]string) []string {
	var diff []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			diff = append(diff, fmt.Sprintf("%s: %.40s vs %.40s (present %v)", k, v, w, ok))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: only in the second", k))
		}
	}
	sort.Strings(diff)
	return diff
}

func s35HistorySeqs(t *testing.T, s *Store, lockKey string) (seqs []uint64) {
	t.Helper()
	prefix := historyPrefix(lockKey)
	if err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketIdent).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return seqs
}

// ---------------------------------------------------------------------------
// A function that writes everything a lease function can write (a fencing
// counter, the ident bucket's sequence and a history key under it, another
// bucket's sequence, the persisted clock, a quarantine mark, the deletion
// of another identity's whole history) and then panics, between two
// acquires of one batch: none of its writes is seen by a later function
// of the batch or committed, and the acquires' tokens and the history
// stay exactly as without it.
func TestReviewS35PoisonedFunctionLeavesNoTrace(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	x, y, z := s35Identity(1), s35Identity(2), s35Identity(3)
	xk, yk, zk := s35LockKey(t, x), s35LockKey(t, y), s35LockKey(t, z)
	// y gets three history entries, committed.
	for i := range 3 {
		r, err := s35Acquire(ctx, s, y, fmt.Sprint("y-acq-", i), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s30HolderOf(r.Lease).release(ctx, s, fmt.Sprint("y-rel-", i)); err != nil {
			t.Fatal(err)
		}
	}
	yHist := s35HistorySeqs(t, s, yk)
	if len(yHist) != 3 {
		t.Fatalf("setup: y has %d history entries", len(yHist))
	}
	before := s35Dump(t, s.db)
	farClock := c.Now().Add(1000 * time.Hour).UnixMilli()

	type seen struct {
		counterX, identSeq, outboxSeq uint64
		clockMs                       int64
		quarantined                   bool
		yHistory                      int
		poisonKey                     bool
	}
	var obs seen
	var ax, az lease.Result
	var axErr, azErr, poisonErr, obsErr error
	var txIDs [3]int
	s35Batch(t, &s.group,
		func() { ax, axErr = s35Acquire(ctx, s, x, "x-acq", time.Minute) },
		func() {
			poisonErr = s.group.update(func(tx *s35Tx) error {
				txIDs[0] = tx.ID()
				ident := tx.Bucket(bucketIdent)
				_ = ident.Put(counterKey(xk), u64(1000))
				seq, _ := ident.NextSequence()
				_ = ident.Put(historyKey(xk, seq), []byte("poison"))
				_, _ = ident.NextSequence()
				_ = tx.Bucket(bucketOutbox).SetSequence(777)
				_ = tx.Bucket(bucketMeta).Put(keyClock, u64(uint64(farClock)))
				_ = tx.Bucket(bucketQuarantine).Put([]byte(xk), []byte("poison"))
				for _, sq := range yHist {
					if err := forgetHistory(tx, historyKey(yk, sq)); err != nil {
						return err
					}
				}
				_ = tx.Bucket(bucketMeta).Put([]byte("s35-poison"), []byte("x"))
				panic("s35: poisoned function")
			})
		},
		func() {
			obsErr = s.group.update(func(tx *s35Tx) error {
				txIDs[1] = tx.ID()
				ident := tx.Bucket(bucketIdent)
				obs = seen{}
				obs.counterX, _ = counterAt(ident, counterKey(xk))
				obs.identSeq = ident.Sequence()
				obs.outboxSeq = tx.Bucket(bucketOutbox).Sequence()
				if v := tx.Bucket(bucketMeta).Get(keyClock); len(v) == 8 {
					obs.clockMs = int64(binary.BigEndian.Uint64(v))
				}
				obs.quarantined = tx.Bucket(bucketQuarantine).Get([]byte(xk)) != nil
				obs.poisonKey = tx.Bucket(bucketMeta).Get([]byte("s35-poison")) != nil
				prefix := historyPrefix(yk)
				cur := tx.Bucket(bucketIdent).Cursor()
				for k, _ := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = cur.Next() {
					obs.yHistory++
				}
				return nil
			})
		},
		func() {
			_ = s.group.update(func(tx *s35Tx) error { txIDs[2] = tx.ID(); return nil })
		},
		func() { az, azErr = s35Acquire(ctx, s, z, "z-acq", time.Minute) },
	)
	if txIDs[0] == 0 || txIDs[0] != txIDs[1] || txIDs[1] != txIDs[2] {
		t.Fatalf("setup: the functions did not share one transaction: %v", txIDs)
	}
	if !errors.Is(poisonErr, errPanicked) {
		t.Fatalf("poisoned function: %v, want errPanicked", poisonErr)
	}
	if axErr != nil || azErr != nil || obsErr != nil {
		t.Fatalf("acquire x %v, acquire z %v, observer %v", axErr, azErr, obsErr)
	}
	if obs.counterX != 1 || obs.quarantined || obs.poisonKey || obs.yHistory != 3 || obs.outboxSeq == 777 ||
		obs.clockMs >= farClock {
		t.Fatalf("a later function of the batch saw the rolled-back function's writes: %+v", obs)
	}
	if ax.Lease.FencingToken != 1 || az.Lease.FencingToken != 1 {
		t.Fatalf("tokens x %d z %d, want 1", ax.Lease.FencingToken, az.Lease.FencingToken)
	}
	// What was committed is the state before plus the two acquires only.
	after := s35Dump(t, s.db)
	for k, v := range before {
		if k == string(bucketIdent)+"/#seq" {
			continue
		}
		if after[k] != v {
			t.Errorf("committed state changed at %s", k)
		}
	}
	if after[string(bucketIdent)+"/#seq"] != before[string(bucketIdent)+"/#seq"] {
		t.Errorf("ident sequence moved from %s to %s: the poisoned NextSequence committed",
			before[string(bucketIdent)+"/#seq"], after[string(bucketIdent)+"/#seq"])
	}
	if s30Quarantined(t, s, xk) != "" {
		t.Error("the quarantine mark committed")
	}
	if got := s35HistorySeqs(t, s, yk); len(got) != 3 {
		t.Errorf("y's history after the batch: %v, want %v", got, yHist)
	}
	if got := s35HistorySeqs(t, s, xk); len(got) != 0 {
		t.Errorf("x has history %v", got)
	}
	// The clock persisted is the acquires', not the poisoned one.
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyClock); len(v) != 8 || int64(binary.BigEndian.Uint64(v)) >= farClock {
			return fmt.Errorf("persisted clock %x", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The next lease of x is at token 2, of z at 2.
	for _, h := range []struct {
		r  lease.Result
		id lease.Identity
		k  string
	}{{ax, x, xk}, {az, z, zk}} {
		if _, err := s30HolderOf(h.r.Lease).release(ctx, s, "rel-"+h.k); err != nil {
			t.Fatal(err)
		}
		n, err := s35Acquire(ctx, s, h.id, "again-"+h.k, time.Minute)
		if err != nil || n.Lease.FencingToken != 2 {
			t.Fatalf("reacquire %s: %+v %v, want token 2", h.id.TargetID, n.Lease, err)
		}
	}
}

// ---------------------------------------------------------------------------
// History keys take the ident bucket's NextSequence: a failing function
// between two releases that takes sequences (and writes history keys with
// them) leaves no gap and no stray entry; the two releases' entries are at
// consecutive sequences, and the bucket's sequence is the second's.
func TestReviewS35HistorySequenceAroundAFailure(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a, b := s35Identity(10), s35Identity(11)
	ak, bk := s35LockKey(t, a), s35LockKey(t, b)
	ra, err := s35Acquire(ctx, s, a, "a-acq", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := s35Acquire(ctx, s, b, "b-acq", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var seq0 uint64
	if err := s.db.View(func(tx *bbolt.Tx) error { seq0 = tx.Bucket(bucketIdent).Sequence(); return nil }); err != nil {
		t.Fatal(err)
	}
	var errA, errB, errP error
	for round := range 2 { // an error, then a panic
		if round == 1 {
			// A second pair of leases for the second round.
			if ra, err = s35Acquire(ctx, s, a, "a-acq-2", time.Minute); err != nil {
				t.Fatal(err)
			}
			if rb, err = s35Acquire(ctx, s, b, "b-acq-2", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.db.View(func(tx *bbolt.Tx) error { seq0 = tx.Bucket(bucketIdent).Sequence(); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		s35Batch(t, &s.group,
			func() { _, errA = s30HolderOf(ra.Lease).release(ctx, s, fmt.Sprint("a-rel-", round)) },
			func() {
				errP = s.group.update(func(tx *s35Tx) error {
					ident := tx.Bucket(bucketIdent)
					for range 5 {
						sq, err := ident.NextSequence()
						if err != nil {
							return err
						}
						if err := ident.Put(historyKey(ak, sq), []byte("stray")); err != nil {
							return err
						}
					}
					if round == 1 {
						panic("s35")
					}
					return errors.New("s35: fail after taking sequences")
				})
			},
			func() { _, errB = s30HolderOf(rb.Lease).release(ctx, s, fmt.Sprint("b-rel-", round)) },
		)
		if errA != nil || errB != nil || errP == nil {
			t.Fatalf("round %d: release a %v, release b %v, failing function %v", round, errA, errB, errP)
		}
		ha, hb := s35HistorySeqs(t, s, ak), s35HistorySeqs(t, s, bk)
		if len(ha) != round+1 || len(hb) != round+1 {
			t.Fatalf("round %d: history a %v b %v", round, ha, hb)
		}
		if ha[round] != seq0+1 || hb[round] != seq0+2 {
			t.Fatalf("round %d: history sequences a %d b %d, want %d and %d", round, ha[round], hb[round], seq0+1, seq0+2)
		}
		var seq uint64
		if err := s.db.View(func(tx *bbolt.Tx) error { seq = tx.Bucket(bucketIdent).Sequence(); return nil }); err != nil {
			t.Fatal(err)
		}
		if seq != seq0+2 {
			t.Fatalf("round %d: ident sequence %d, want %d", round, seq, seq0+2)
		}
	}
}

// ---------------------------------------------------------------------------
// trimHistory walks an identity's history backwards (seekLast, Prev) over
// entries committed before and entries earlier functions of the same batch
// wrote and deleted, and deletes while the batch goes on. Many archives of
// one identity in one batch, with failing functions among them, store
// exactly what the same successful archives store one transaction each.
func TestReviewS35BatchedArchivesEqualSerial(t *testing.T) {
	ctx := context.Background()
	// A template record (a real lease's) for synthetic archives.
	tmplStore := openTemp(t, Options{ReapInterval: -1})
	id := s35Identity(20)
	tr, err := s35Acquire(ctx, tmplStore, id, "tmpl", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := tr.Lease
	lockKey := tmpl.LockKey
	endedAt := lease.UnixMilli(tmpl.AcquiredAt.UnixMilli() + 1000)
	archiveN := func(s *Store, n int) func(*s35Tx) error {
		return func(tx *s35Tx) error {
			r := tmpl.Clone()
			r.LeaseID = fmt.Sprintf("%s-%03d", tmpl.LeaseID[:len(tmpl.LeaseID)-4], n)
			r.FencingToken = uint64(n + 1)
			return s.archive(tx, r, lease.StateReleased, lease.UnixMilli(endedAt.UnixMilli()+int64(n)), ended{by: "s35"})
		}
	}
	failing := func(s *Store, n int, panics bool) func(*s35Tx) error {
		return func(tx *s35Tx) error {
			if err := archiveN(s, n)(tx); err != nil {
				return err
			}
			if panics {
				panic("s35")
			}
			return errors.New("s35: fail after archiving")
		}
	}
	const per = 3
	const pre, batch = 4, 12
	open := func() *Store {
		return openTemp(t, Options{ReapInterval: -1, StoreOptions: lease.StoreOptions{HistoryPerIdentity: per}})
	}
	serial, batched := open(), open()
	for _, s := range []*Store{serial, batched} {
		for n := range pre {
			if err := s.group.update(archiveN(s, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for n := pre; n < pre+batch; n++ {
		if err := serial.group.update(archiveN(serial, n)); err != nil {
			t.Fatal(err)
		}
	}
	var calls []func()
	var failures atomic.Int32
	for n := pre; n < pre+batch; n++ {
		calls = append(calls, func() {
			if err := batched.group.update(archiveN(batched, n)); err != nil {
				t.Errorf("archive %d: %v", n, err)
			}
		})
		if n%3 == 1 {
			calls = append(calls, func() {
				if batched.group.update(failing(batched, 100+n, n%2 == 0)) != nil {
					failures.Add(1)
				}
			})
		}
	}
	s35Batch(t, &batched.group, calls...)
	if failures.Load() == 0 {
		t.Fatal("setup: no failing function ran")
	}
	if got := s35HistorySeqs(t, batched, lockKey); len(got) != per {
		t.Errorf("history kept %v, want %d entries", got, per)
	}
	if d := s35DiffDumps(s35Dump(t, serial.db), s35Dump(t, batched.db)); len(d) > 0 {
		t.Fatalf("one batch (with failures) stored other than the same archives one transaction each:\n%v", d)
	}
}

// ---------------------------------------------------------------------------
// Reaper slices in one batch, after acquires of the same batch and around a
// failing slice: the merged index cursor sees what earlier functions
// deleted and wrote. Every expired lease is archived exactly once, the
// live one written in the batch stays, and the indexes end empty of the
// expired ones.
func TestReviewS35ReaperSlicesInOneBatch(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	const n = 2*reapSlice + 5
	keys := make([]string, n)
	for i := range n {
		id := s35Identity(100 + i)
		keys[i] = s35LockKey(t, id)
		if _, err := s35Acquire(ctx, s, id, "acq", time.Duration(i+1)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.Add(time.Minute)
	live := s35Identity(999)
	liveKey := s35LockKey(t, live)
	counts := make([]int, 5)
	var errs [5]error
	var liveErr error
	slice := func(i int, fail bool) func() {
		return func() {
			errs[i] = s.group.update(func(tx *s35Tx) error {
				got, err := s.expireSlice(tx)
				counts[i] = got
				if err == nil && fail {
					return errors.New("s35: failing reaper slice")
				}
				return err
			})
		}
	}
	s35Batch(t, &s.group,
		func() { _, liveErr = s35Acquire(ctx, s, live, "live", time.Hour) },
		slice(0, false),
		slice(1, true), // would take the second slice, rolled back
		slice(2, false),
		slice(3, false),
		slice(4, false),
	)
	if liveErr != nil || errs[0] != nil || errs[1] == nil || errs[2] != nil || errs[3] != nil || errs[4] != nil {
		t.Fatalf("live %v, slices %v", liveErr, errs)
	}
	if counts[0] != reapSlice || counts[2] != reapSlice || counts[3] != 5 || counts[4] != 0 {
		t.Fatalf("slices consumed %v, want %d, (failed), %d, 5, 0", counts, reapSlice, reapSlice)
	}
	for i, k := range keys {
		if h := s35HistorySeqs(t, s, k); len(h) != 1 {
			t.Errorf("lease %d archived %d times", i, len(h))
		}
		if storedActive(t, s, k) != nil {
			t.Errorf("lease %d still active", i)
		}
	}
	if storedActive(t, s, liveKey) == nil {
		t.Error("the live lease written in the batch was reaped")
	}
	var left int
	if err := s.db.View(func(tx *bbolt.Tx) error { left = tx.Bucket(bucketActiveExp).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	if left != 1 {
		t.Errorf("%d active expiry entries left, want the live one's", left)
	}
}

// ---------------------------------------------------------------------------
// The audit sink's counts (events, high-priority events) are kept in the
// meta bucket by every write and prune of a batch; with duplicates and
// failing functions in the batch and pruning past MaxEvents, the counts
// end equal to the stored events, and the duplicate of an event written
// earlier in the same batch is refused.
func TestReviewS35AuditCountsMatchAcrossFailures(t *testing.T) {
	ctx := context.Background()
	ck := &clock{t: auditT0}
	s, err := OpenAudit(filepath.Join(t.TempDir(), "audit.db"), AuditOptions{MaxEvents: 6, MaxAge: time.Hour, Now: ck.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var evs []audit.Event
	for range 20 {
		evs = append(evs, audittest.AcquireEvent(ck.Now()))
		ck.Add(time.Second)
	}
	for _, e := range evs[:4] {
		if err := s.Write(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	var dupErr error
	var writeErrs [16]error
	var failed atomic.Int32
	var calls []func()
	for i, e := range evs[4:] {
		calls = append(calls, func() { writeErrs[i] = s.Write(ctx, e) })
		if i == 3 {
			calls = append(calls, func() { dupErr = s.Write(ctx, evs[5]) }) // written earlier in this batch
		}
		if i%5 == 2 {
			calls = append(calls, func() {
				err := s.group.update(func(tx *s35Tx) error {
					extra := audittest.AcquireEvent(ck.Now().Add(-time.Minute))
					b, _ := audit.Marshal(extra)
					if _, err := s.putEvents(tx, []auditEntry{{[]byte(extra.EventID), b}}, nil); err != nil {
						return err
					}
					if i%2 == 0 {
						panic("s35")
					}
					return errors.New("s35: failing audit write")
				})
				if err != nil {
					failed.Add(1)
				}
			})
		}
	}
	s35Batch(t, &s.group, calls...)
	// Exactly one of the two writes of evs[5] stores it; the other is the
	// duplicate. (The branch answers the one queued first; the parent
	// answered the later one, run alone first after the batch failed.)
	if errors.Is(dupErr, ErrDuplicateAuditEvent) == errors.Is(writeErrs[1], ErrDuplicateAuditEvent) {
		t.Fatalf("two writes of one event in a batch: %v and %v, want one stored and one duplicate", writeErrs[1], dupErr)
	}
	t.Logf("first write of the event: %v; second: %v", writeErrs[1], dupErr)
	for i, err := range writeErrs {
		if err != nil && i != 1 {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if failed.Load() == 0 {
		t.Fatal("setup: no failing function")
	}
	var n, high, keys, highKeys uint64
	if err := s.db.View(func(tx *bbolt.Tx) error {
		m := tx.Bucket(auditBucketMeta)
		if v := m.Get(auditKeyCount); len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		if v := m.Get(auditKeyHigh); len(v) == 8 {
			high = binary.BigEndian.Uint64(v)
		}
		return tx.Bucket(auditBucketEvents).ForEach(func(k, v []byte) error {
			keys++
			if auditHighPriority(v) {
				highKeys++
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if n != keys || high != highKeys {
		t.Fatalf("audit counts %d (%d high), stored %d (%d high)", n, high, keys, highKeys)
	}
	if keys != 6 {
		t.Fatalf("%d events kept, want MaxEvents 6", keys)
	}
	got, err := s.Read(ctx, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !auditEq(auditIDs(got), auditIDs(evs[14:])) {
		t.Fatalf("kept %v, want the newest six %v", auditIDs(got), auditIDs(evs[14:]))
	}
}

// ---------------------------------------------------------------------------
// The dead-letter bound (lease.MaxOutboxDeadLetters) holds when the calls
// that fill it share a transaction: with one place left, two dead-letter
// calls in one batch store one and refuse the other.
func TestReviewS35DeadLetterBoundInOneBatch(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	a, err := s.Acquire(ctx, acquireReq("req-1", 30*time.Second, s35Far))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		m := lease.OutboxMessage{RoutingKey: "q", Body: []byte("x")}
		if _, err := s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: testIdentity, LeaseID: a.Lease.LeaseID,
			FencingToken: a.Lease.FencingToken, ServiceInstanceID: "instance-1", Sink: "rabbitmq", CommitID: fmt.Sprint("commit-", i),
			ExecutionID: "execution-1", JobID: "job-1", Outbox: &m, DeadlineAt: s35Far, Caller: lease.Caller{PrincipalID: "prn-actor"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		dead := tx.Bucket(bucketOutboxDead)
		for i := range lease.MaxOutboxDeadLetters - 1 {
			if err := dead.Put(u64(uint64(i+1)), []byte("{}")); err != nil {
				return err
			}
		}
		return dead.SetSequence(uint64(lease.MaxOutboxDeadLetters - 1))
	}); err != nil {
		t.Fatal(err)
	}
	pending, err := s.OutboxPending(ctx, 10)
	if err != nil || len(pending) != 2 {
		t.Fatalf("pending %v, %v", pending, err)
	}
	var errs [2]error
	s35Batch(t, &s.group,
		func() { errs[0] = s.OutboxDeadLetter(ctx, pending[0].MessageID, "poison") },
		func() { errs[1] = s.OutboxDeadLetter(ctx, pending[1].MessageID, "poison") },
	)
	n, err := s.OutboxDeadLen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n > lease.MaxOutboxDeadLetters {
		t.Fatalf("%d dead letters stored, bound %d (answers %v, %v)", n, lease.MaxOutboxDeadLetters, errs[0], errs[1])
	}
	if errs[0] != nil || lease.CodeOf(errs[1]) != lease.CodeBackendUnavailable {
		t.Fatalf("answers %v, %v: want the first stored and the second refused", errs[0], errs[1])
	}
}

// ---------------------------------------------------------------------------
// Fencing under load with failures injected into shared batches: many
// holders acquire, renew and release a few identities concurrently while
// poisoned functions (which raise counters and take sequences, then fail
// or panic) share their transactions. Every granted token of an identity
// is above every earlier one, replays answer the original token, a stale
// holder is refused with lease_lost, and each stored counter equals the
// highest token granted.
func TestReviewS35FencingUnderInjectedFailures(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	const idents, workers, rounds = 3, 6, 40
	ids := make([]lease.Identity, idents)
	keys := make([]string, idents)
	for i := range idents {
		ids[i] = s35Identity(300 + i)
		keys[i] = s35LockKey(t, ids[i])
	}
	var mu sync.Mutex
	granted := make([][]uint64, idents) // in grant order, per identity
	stop := make(chan struct{})
	var poisonWG sync.WaitGroup
	for p := range 2 {
		poisonWG.Add(1)
		go func() {
			defer poisonWG.Done()
			rng := rand.New(rand.NewSource(int64(p)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[rng.Intn(idents)]
				_ = s.group.update(func(tx *s35Tx) error {
					ident := tx.Bucket(bucketIdent)
					_ = ident.Put(counterKey(k), u64(1<<40))
					_, _ = ident.NextSequence()
					_ = ident.Delete(activeKey(k))
					_ = tx.Bucket(bucketMeta).Put(keyClock, u64(1<<50))
					if rng.Intn(2) == 0 {
						panic("s35 poison")
					}
					return errors.New("s35 poison")
				})
			}
		}()
	}
	var wg sync.WaitGroup
	var failures atomic.Int32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				i := (w + r) % idents
				reqID := fmt.Sprintf("w%d-r%d", w, r)
				res, err := s35Acquire(ctx, s, ids[i], reqID, time.Minute)
				if err != nil {
					if lease.CodeOf(err) != lease.CodeConflict {
						failures.Add(1)
						t.Errorf("acquire: %v", err)
					}
					continue
				}
				tok := res.Lease.FencingToken
				mu.Lock()
				if g := granted[i]; len(g) > 0 && tok <= g[len(g)-1] {
					t.Errorf("identity %d: token %d granted after %d", i, tok, g[len(g)-1])
				}
				granted[i] = append(granted[i], tok)
				mu.Unlock()
				if rep, err := s35Acquire(ctx, s, ids[i], reqID, time.Minute); err != nil || rep.Lease.FencingToken != tok || !rep.Replayed {
					t.Errorf("replay of %s: %+v, %v, want token %d replayed", reqID, rep.Lease, err, tok)
				}
				h := s30HolderOf(res.Lease)
				if _, err := h.renew(ctx, s, reqID+"-renew", time.Minute); err != nil {
					t.Errorf("renew: %v", err)
				}
				if _, err := h.release(ctx, s, reqID+"-rel"); err != nil {
					t.Errorf("release: %v", err)
				}
				if _, err := h.renew(ctx, s, reqID+"-stale", time.Minute); lease.CodeOf(err) != lease.CodeLost {
					t.Errorf("stale renew: %v, want lease_lost", err)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	poisonWG.Wait()
	for i := range idents {
		c, err := (faults{s}).Counter(ctx, keys[i])
		if err != nil {
			t.Fatal(err)
		}
		g := granted[i]
		if len(g) == 0 {
			t.Fatalf("identity %d: no grant", i)
		}
		if c != g[len(g)-1] {
			t.Errorf("identity %d: counter %d, highest token granted %d", i, c, g[len(g)-1])
		}
		if len(s35HistorySeqs(t, s, keys[i])) != min(len(g), lease.DefaultHistoryPerIdentity) {
			t.Errorf("identity %d: %d history entries for %d leases", i, len(s35HistorySeqs(t, s, keys[i])), len(g))
		}
	}
	var clockMs int64
	if err := s.db.View(func(tx *bbolt.Tx) error {
		clockMs = int64(binary.BigEndian.Uint64(tx.Bucket(bucketMeta).Get(keyClock)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if clockMs >= 1<<50 {
		t.Error("a poisoned clock write committed")
	}
}

// ---------------------------------------------------------------------------
// A read while a batch is in progress reports no time after the time of a
// write in that batch it does not see (readTx caps at the pending
// transaction's time), also when the function that registered the time
// first is rolled back; and time read never goes backwards across the
// commit.
func TestReviewS35ReadTimeNotAfterUnseenWrite(t *testing.T) { s35ReadTimeNotAfterUnseenWrite(t, 0) }

// s35ReadTimeNotAfterUnseenWrite runs the test with the store's flush
// interval (0: every batch flushed before it is answered, in this
// package's tests).
func s35ReadTimeNotAfterUnseenWrite(t *testing.T, flush time.Duration) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1, FlushInterval: flush})
	old, err := s35Acquire(ctx, s, testIdentity, "acq-1", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lockKey := old.Lease.LockKey
	other := s35Identity(400)
	if _, err := s35Acquire(ctx, s, other, "acq-other", time.Hour); err != nil {
		t.Fatal(err)
	}
	var tPoison, tWrite lease.Timestamp
	inWrite := make(chan struct{})
	proceed := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s35Batch(t, &s.group,
			func() {
				_ = s.group.update(func(tx *s35Tx) error {
					tPoison = s.clock(tx)
					return errors.New("s35: registered the time, then failed")
				})
			},
			func() {
				_ = s.group.update(func(tx *s35Tx) error {
					c.Add(20 * time.Second) // the old lease has expired at this write's time
					tWrite = s.clock(tx)
					cur, err := s.loadActive(tx, lockKey)
					if err != nil || cur == nil {
						return fmt.Errorf("no active: %v", err)
					}
					if err := s.archive(tx, cur, lease.StateExpired, cur.ExpiresAt, ended{}); err != nil {
						return err
					}
					close(inWrite)
					<-proceed
					return nil
				})
			},
		)
	}()
	<-inWrite
	c.Add(time.Second)
	res, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: s35Far})
	if err != nil {
		t.Fatal(err)
	}
	// The read does not see the archive; it must answer at a time no
	// later than the archive's.
	if res.Lease == nil || res.Lease.State != lease.StateActive && res.Lease.State != lease.StateExpired {
		t.Fatalf("inspect during the batch: %+v", res.Lease)
	}
	if tWrite.Before(res.BackendTime) {
		t.Fatalf("a read that does not see the batch's write reports %s, after the write's time %s", res.BackendTime, tWrite)
	}
	first := res.BackendTime
	close(proceed)
	<-done
	if tWrite.Before(tPoison) {
		t.Fatalf("time went backwards inside one batch: %s then %s", tPoison, tWrite)
	}
	if _, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: s35Far}); lease.CodeOf(err) != lease.CodeNotFound {
		t.Fatalf("after the commit the archived lease is inspected: %v", err)
	}
	res2, err := s.Inspect(ctx, lease.InspectRequest{Identity: other, DeadlineAt: s35Far})
	if err != nil {
		t.Fatal(err)
	}
	if res2.BackendTime.Before(first) || res2.BackendTime.Before(tWrite) {
		t.Fatalf("time after the commit %s, before %s / the write's %s", res2.BackendTime, first, tWrite)
	}
}

// ---------------------------------------------------------------------------
// A value read in a batch and then overwritten, and a key returned by a
// cursor and then deleted, keep their bytes (as bbolt's do for the
// transaction): the overwrite and delete do not reach into what was
// returned.
func TestReviewS35ReturnedBytesSurviveLaterWrites(t *testing.T) {
	s := openTemp(t, Options{ReapInterval: -1})
	var v1, k1 []byte
	var v1copy, k1copy []byte
	var errs [3]error
	s35Batch(t, &s.group,
		func() {
			errs[0] = s.group.update(func(tx *s35Tx) error {
				m := tx.Bucket(bucketMeta)
				if err := m.Put([]byte("s35-a"), []byte("first value")); err != nil {
					return err
				}
				return m.Put([]byte("s35-b"), []byte("b"))
			})
		},
		func() {
			errs[1] = s.group.update(func(tx *s35Tx) error {
				m := tx.Bucket(bucketMeta)
				v1 = m.Get([]byte("s35-a"))
				v1copy = bytes.Clone(v1)
				k1, _ = m.Cursor().Seek([]byte("s35-b"))
				k1copy = bytes.Clone(k1)
				if err := m.Put([]byte("s35-a"), []byte("SECOND VALUE")); err != nil {
					return err
				}
				if err := m.Delete([]byte("s35-b")); err != nil {
					return err
				}
				if !bytes.Equal(v1, v1copy) || !bytes.Equal(k1, k1copy) {
					return fmt.Errorf("returned bytes changed by later writes: %q %q", v1, k1)
				}
				return nil
			})
		},
		func() {
			errs[2] = s.group.update(func(tx *s35Tx) error {
				if got := tx.Bucket(bucketMeta).Get([]byte("s35-a")); string(got) != "SECOND VALUE" {
					return fmt.Errorf("later function reads %q", got)
				}
				if tx.Bucket(bucketMeta).Get([]byte("s35-b")) != nil {
					return errors.New("deleted key still read")
				}
				return nil
			})
		},
	)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("function %d: %v", i, err)
		}
	}
	if !bytes.Equal(v1, v1copy) || !bytes.Equal(k1, k1copy) {
		t.Fatalf("returned bytes changed after the commit: %q %q", v1, k1)
	}
}

// ---------------------------------------------------------------------------
// A write that fails alone leaves the file as it was: no transaction
// commits for it (before the change its transaction rolled back). On the
// branch the batch of one failing function commits an empty transaction:
// an extra meta page write and fsync for every failed write (and every
// duplicate audit event), and the transaction id moves on.
func TestReviewS35FailedWriteCommitsNoTransaction(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	if _, err := s.Acquire(ctx, acquireReq("req-1", time.Minute, s35Far)); err != nil {
		t.Fatal(err)
	}
	before := lastTxID(t, s.db)
	err := s.mutate(ctx, func(tx *s35Tx) error {
		_ = s.clock(tx)
		return errors.New("s35: failing write")
	})
	if code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("failing write: %v", err)
	}
	if after := lastTxID(t, s.db); after != before {
		t.Fatalf("a write that failed alone committed %d transaction(s) (txid %d -> %d)", after-before, before, after)
	}
}

// ---------------------------------------------------------------------------
// Commit fencing in one batch: a function that raises the high-water mark
// and the commit sequence, then panics, sits between two commits of the
// current holder; both are authorized with consecutive sequences, the mark
// stays the holder's token, and a commit of the previous holder's token in
// the same batch is refused.
func TestReviewS35CommitFencingAroundAFailure(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	first, err := s35Acquire(ctx, s, testIdentity, "acq-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(r *lease.Record, id string) (lease.CommitResult, error) {
		return s.AuthorizeCommit(ctx, lease.CommitRequest{Identity: testIdentity, LeaseID: r.LeaseID, FencingToken: r.FencingToken,
			ServiceInstanceID: "instance-1", Sink: "couchdb", CommitID: id, ExecutionID: "execution-1", JobID: "job-1",
			Target: "doc-" + id, DeadlineAt: s35Far, Caller: lease.Caller{PrincipalID: "prn-actor"}})
	}
	if _, err := commit(first.Lease, "c-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s30HolderOf(first.Lease).release(ctx, s, "rel-1"); err != nil {
		t.Fatal(err)
	}
	second, err := s35Acquire(ctx, s, testIdentity, "acq-2", time.Minute)
	if err != nil || second.Lease.FencingToken != 2 {
		t.Fatalf("second lease %+v %v", second.Lease, err)
	}
	lockKey := second.Lease.LockKey
	var r1, r2 lease.CommitResult
	var e1, e2, eStale, eP error
	s35Batch(t, &s.group,
		func() { r1, e1 = commit(second.Lease, "c-1") },
		func() {
			eP = s.group.update(func(tx *s35Tx) error {
				_ = tx.Bucket(bucketHighWater).Put(join(lockKey, "couchdb"), u64(1<<40))
				_ = tx.Bucket(bucketCommitSeq).Put([]byte(lockKey), u64(1<<40))
				panic("s35")
			})
		},
		func() { _, eStale = commit(first.Lease, "c-stale") },
		func() { r2, e2 = commit(second.Lease, "c-2") },
	)
	if e1 != nil || e2 != nil || eP == nil {
		t.Fatalf("commits %v, %v; poisoned %v", e1, e2, eP)
	}
	if c := lease.CodeOf(eStale); c != lease.CodeLost && c != lease.CodeCommitRejected {
		t.Fatalf("the previous holder's commit: %v", eStale)
	}
	if r1.Commit.Seq != 2 || r2.Commit.Seq != 3 {
		t.Fatalf("commit sequences %d, %d, want 2, 3", r1.Commit.Seq, r2.Commit.Seq)
	}
	var mark uint64
	if err := s.db.View(func(tx *bbolt.Tx) error {
		mark = binary.BigEndian.Uint64(tx.Bucket(bucketHighWater).Get(join(lockKey, "couchdb")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if mark != 2 {
		t.Fatalf("high-water mark %d, want 2", mark)
	}
}
