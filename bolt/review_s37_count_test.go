package bolt

// Review s37: attacks on schema 9's per-identity history count
// (kindHistoryCount, kept by archive/trimHistory and forgetHistory).
// Every test reads back what the store holds — history entries in the
// ident bucket, the count, the History listing, Inspect by lease id — and
// compares it with a model: an identity keeps the newest
// HistoryPerIdentity leases it ended (trimmed when it next ends one),
// minus those past HistoryRetention once the reaper ran.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// storedHistory is what s holds (through the engine's layers, so unflushed
// writes count) of lockKey's history: the lease ids of its entries,
// oldest first, and its count entry (has false if none).
func storedHistory(t *testing.T, s *Store, lockKey string) (ids []string, count uint64, has bool) {
	t.Helper()
	tx, release, _, err := s.readTx()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	return storedHistoryIn(t, tx, lockKey)
}

func storedHistoryIn(t *testing.T, tx *layered.View, lockKey string) (ids []string, count uint64, has bool) {
	t.Helper()
	ident := tx.Bucket(bucketIdent)
	prefix := historyPrefix(lockKey)
	c := ident.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		h, err := lease.DecodeStoredHistoryAt(v, lockKey)
		if err != nil {
			t.Fatalf("history entry does not decode: %v", err)
		}
		ids = append(ids, h.Record.LeaseID)
	}
	if v := ident.Get(historyCountKey(lockKey)); v != nil {
		if len(v) != 8 {
			t.Fatalf("history count of %d bytes", len(v))
		}
		count, has = binary.BigEndian.Uint64(v), true
	}
	return ids, count, has
}

// s37FileStored is storedHistory read from the closed file at path itself.
func s37FileStored(t *testing.T, path, lockKey string) (ids []string, count uint64, has bool) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(btx *bbolt.Tx) error {
		ids, count, has = storedHistoryIn(t, readView(btx), lockKey)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids, count, has
}

type s37Ended struct {
	id    string
	state lease.State
	ms    int64 // ended_at
}

type s37Ident struct {
	id      lease.Identity
	lockKey string
	active  *lease.Record // the active record the store holds, nil if none
	hist    []s37Ended    // kept entries, oldest first
	// uncounted: no count entry until the identity next ends a lease (a
	// schema 8 file).
	uncounted bool
}

// s37Model drives a store through the lease API and keeps the model.
type s37Model struct {
	t        *testing.T
	ctx      context.Context
	c        *clock
	dir      string
	path     string
	s        *Store
	o        Options
	idents   []*s37Ident
	ended    map[string]*s37Ident // every lease id ever ended → its identity
	endState map[string]lease.State
	reqN     int
	restores int
	// seen counts what the run went through (trims, trims of an
	// uncounted identity, retention drops, recoveries ending leases).
	seen      map[string]int
	log       []string
	checkFile bool
}

func newS37Model(t *testing.T, bound int, retention time.Duration, nIdents int, flush time.Duration) *s37Model {
	dir := t.TempDir()
	m := &s37Model{t: t, ctx: context.Background(), c: &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}, dir: dir,
		path: filepath.Join(dir, "s37-0.db"), ended: map[string]*s37Ident{}, seen: map[string]int{}, endState: map[string]lease.State{}}
	so := leasetest.StoreOptions()
	so.HistoryPerIdentity, so.HistoryRetention = bound, retention
	m.o = Options{StoreOptions: so, Now: m.c.Now, ReapInterval: -1, FlushInterval: flush}
	for i := 0; i < nIdents; i++ {
		id := testIdentity
		id.TargetID = fmt.Sprintf("s37-target-%d", i)
		_, key, err := lease.CanonicalLockKey(id, so.WithDefaults().OperationClasses)
		if err != nil {
			t.Fatal(err)
		}
		m.idents = append(m.idents, &s37Ident{id: id, lockKey: key})
	}
	m.open()
	t.Cleanup(func() {
		if m.s != nil {
			m.s.Close()
		}
	})
	return m
}

func (m *s37Model) fatalf(format string, args ...any) {
	m.t.Helper()
	tail := m.log
	if len(tail) > 25 {
		tail = tail[len(tail)-25:]
	}
	m.t.Fatalf("%s\nlast steps:\n%v", fmt.Sprintf(format, args...), tail)
}

func (m *s37Model) step(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...)+"\n")
}

func (m *s37Model) open() {
	m.t.Helper()
	s, err := Open(m.path, m.o)
	if err != nil {
		m.fatalf("open %s: %v", m.path, err)
	}
	m.s = s
}

func (m *s37Model) now() lease.Timestamp { return lease.At(m.c.Now()) }

func (m *s37Model) req() string { m.reqN++; return fmt.Sprintf("s37-req-%d", m.reqN) }

// archive is the model of archive: the entry is added, then the oldest go
// down to the bound.
func (m *s37Model) archive(id *s37Ident, rec *lease.Record, state lease.State, at lease.Timestamp) {
	id.hist = append(id.hist, s37Ended{rec.LeaseID, state, at.UnixMilli()})
	if over := len(id.hist) - m.o.HistoryPerIdentity; over > 0 {
		id.hist = slices.Clone(id.hist[over:])
		m.seen["trim"]++
		if over > 1 {
			m.seen["trim several"]++
		}
		if id.uncounted {
			m.seen["trim uncounted"]++
		}
	}
	id.uncounted = false
	id.active = nil
	m.ended[rec.LeaseID] = id
	m.endState[rec.LeaseID] = state
}

// endExpired is the model of a request that finds id's lease expired:
// archived as expired at its expiry.
func (m *s37Model) endExpired(id *s37Ident) {
	m.archive(id, id.active, lease.StateExpired, id.active.ExpiresAt)
}

func (m *s37Model) acquire(id *s37Ident, ttl time.Duration) {
	m.t.Helper()
	req := acquireReq(m.req(), ttl, rhFar)
	req.Identity = id.id
	res, err := m.s.Acquire(m.ctx, req)
	m.step("acquire %s ttl %v: %v", id.id.TargetID, ttl, err)
	if id.active != nil && id.active.LiveAt(m.now()) {
		if code(err) != lease.CodeConflict {
			m.fatalf("acquire over a live lease: %v, want conflict", err)
		}
		return
	}
	if err != nil {
		m.fatalf("acquire: %v", err)
	}
	if id.active != nil {
		m.endExpired(id)
	}
	id.active = res.Lease
}

// end runs a terminal request (release, revoke, force-release or a renewal)
// on id's lease.
func (m *s37Model) end(id *s37Ident, op string) {
	m.t.Helper()
	if id.active == nil {
		return
	}
	rec := id.active
	live := rec.LiveAt(m.now())
	var res lease.Result
	var err error
	var state lease.State
	switch op {
	case "release":
		res, err = m.s.Release(m.ctx, lease.ReleaseRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			ServiceInstanceID: rec.ServiceInstanceID, Mutation: lease.Mutation{RequestID: m.req(), DeadlineAt: rhFar, Caller: callerOfRecord(rec)}})
		state = lease.StateReleased
	case "revoke":
		res, err = m.s.Revoke(m.ctx, rhAdminReq(m.req(), rec, "s37", "inc-s37"))
		_, state = lease.AdminOutcome(lease.OpRevoke)
	case "force":
		res, err = m.s.ForceRelease(m.ctx, rhAdminReq(m.req(), rec, "s37", "inc-s37"))
		_, state = lease.AdminOutcome(lease.OpForceRelease)
	case "renew":
		res, err = m.s.Renew(m.ctx, lease.RenewRequest{Identity: rec.Identity(), LeaseID: rec.LeaseID, FencingToken: rec.FencingToken,
			ServiceInstanceID: rec.ServiceInstanceID, TTL: time.Duration(rec.TTLMs) * time.Millisecond,
			Mutation: lease.Mutation{RequestID: m.req(), DeadlineAt: rhFar, Caller: callerOfRecord(rec)}})
	case "expire":
		err = faults{m.s}.ExpireIfCurrent(m.ctx, rec.LockKey, rec.LeaseID, rec.FencingToken)
	}
	m.step("%s %s (live %v): %v", op, id.id.TargetID, live, err)
	switch {
	case op == "expire":
		if err != nil {
			m.fatalf("expire: %v", err)
		}
		if !live {
			m.endExpired(id)
		}
	case !live:
		if code(err) != lease.CodeLost {
			m.fatalf("%s of an expired lease: %v, want lease_lost", op, err)
		}
		m.endExpired(id)
	case err != nil:
		m.fatalf("%s: %v", op, err)
	case op == "renew":
		id.active = res.Lease
	default:
		m.archive(id, rec, state, m.now())
	}
}

// reap runs a reaper pass: due leases expire into history, then entries
// past retention go.
func (m *s37Model) reap() {
	m.t.Helper()
	if err := m.s.reap(m.ctx); err != nil {
		m.fatalf("reap: %v", err)
	}
	now := m.now()
	for _, id := range m.idents {
		if id.active != nil && !id.active.LiveAt(now) {
			m.endExpired(id)
		}
	}
	cutoff := now.UnixMilli() - m.o.HistoryRetention.Milliseconds() - 1
	for _, id := range m.idents {
		n := len(id.hist)
		id.hist = slices.DeleteFunc(id.hist, func(e s37Ended) bool { return e.ms <= cutoff })
		if len(id.hist) < n {
			m.seen["retention"]++
			if id.uncounted {
				m.seen["retention uncounted"]++
			}
			if len(id.hist) == 0 {
				m.seen["retention to empty"]++
			}
		}
	}
	m.step("reap at %d", now.UnixMilli())
}

// reopen closes the store (cleanly, or as a crash) and opens it with
// HistoryPerIdentity bound.
func (m *s37Model) reopen(bound int, crashIt bool) {
	m.t.Helper()
	if crashIt {
		m.seen["crash"]++
		crash(m.t, m.s)
	} else if err := m.s.Close(); err != nil {
		m.fatalf("close: %v", err)
	}
	m.s = nil
	if m.checkFile && !crashIt {
		m.checkClosedFile()
	}
	m.o.HistoryPerIdentity = bound
	m.open()
	m.step("reopen bound %d crash %v", bound, crashIt)
}

// asSchema8 makes the store a schema 8 file (no counts) and opens it.
func (m *s37Model) asSchema8() {
	m.t.Helper()
	if err := m.s.Close(); err != nil {
		m.fatalf("close: %v", err)
	}
	db, err := bbolt.Open(m.path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		ident := tx.Bucket(bucketIdent)
		var drop [][]byte
		if err := ident.ForEach(func(k, _ []byte) error {
			if _, kind, ok := splitIdentKey(k); ok && kind == kindHistoryCount && len(k) == packedLen+1 {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range drop {
			if err := ident.Delete(k); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV8))
	}); err != nil {
		m.t.Fatal(err)
	}
	db.Close()
	for _, id := range m.idents {
		id.uncounted = true
	}
	m.open()
	m.step("as schema 8")
}

// restore backs the store up, restores it to a new path, finishes
// recovery there with HistoryPerIdentity bound (ending every active
// lease) and opens the recovered store.
func (m *s37Model) restore(bound int) {
	m.t.Helper()
	var buf bytes.Buffer
	h, err := m.s.Backup(m.ctx, &buf)
	if err != nil {
		m.fatalf("backup: %v", err)
	}
	total := 0
	for _, id := range m.idents {
		total += len(id.hist)
	}
	if h.Counts["history"] != int64(total) {
		m.fatalf("backup header counts %d history entries, the store holds %d", h.Counts["history"], total)
	}
	if err := m.s.Close(); err != nil {
		m.fatalf("close: %v", err)
	}
	m.s = nil
	m.restores++
	m.path = filepath.Join(m.dir, fmt.Sprintf("s37-r%d.db", m.restores))
	m.o.HistoryPerIdentity = bound
	ns := NewNamespace(m.path, m.o)
	if _, err := ns.Restore(m.ctx, bytes.NewReader(buf.Bytes())); err != nil {
		m.fatalf("restore: %v", err)
	}
	cl, err := ns.OpenClosed(m.ctx)
	if err != nil {
		m.fatalf("open closed: %v", err)
	}
	// Recovery's scans of the ident bucket take no count for a counter
	// or an active record.
	st, err := cl.State(m.ctx)
	if err != nil {
		m.fatalf("restored state: %v", err)
	}
	actives := 0
	known := map[string]bool{}
	for _, id := range m.idents {
		if id.active != nil {
			actives++
		}
		known[id.lockKey] = true
	}
	for k := range st.Counters {
		if !known[k] {
			m.fatalf("restored state has a counter of %q, no identity's", k)
		}
	}
	if len(st.Active) != actives {
		m.fatalf("restored state: %d active, %d counters; the model holds %d active of %d identities", len(st.Active), len(st.Counters), actives, len(m.idents))
	}
	plan := lease.RecoveryPlan{Epoch: 1, Reason: "s37 recovery"}
	res, err := cl.Finish(m.ctx, plan)
	if err != nil {
		m.fatalf("finish: %v", err)
	}
	for _, id := range m.idents {
		if id.active != nil {
			e := plan.Ending(id.active, res.At)
			m.archive(id, id.active, e.State, e.At)
			m.seen["recovery ends"]++
		}
	}
	m.open()
	m.step("restore bound %d", bound)
}

// check compares the store with the model: entries, count, the History
// listing (paged) and Inspect of every lease ever ended.
func (m *s37Model) check(when string) {
	m.t.Helper()
	for _, id := range m.idents {
		ids, count, has := storedHistory(m.t, m.s, id.lockKey)
		want := make([]string, len(id.hist))
		for i, e := range id.hist {
			want[i] = e.id
		}
		if !slices.Equal(ids, want) {
			m.fatalf("%s: %s holds history %v, want %v (bound %d)", when, id.id.TargetID, ids, want, m.o.HistoryPerIdentity)
		}
		switch {
		case id.uncounted && has:
			m.fatalf("%s: %s has count %d before it ended a lease since schema 8", when, id.id.TargetID, count)
		case !id.uncounted && (has != (len(ids) > 0) || count != uint64(len(ids))):
			m.fatalf("%s: %s has count %d (stored %v) for %d entries", when, id.id.TargetID, count, has, len(ids))
		}
		// The listing, newest first, in pages.
		var listed []string
		token := ""
		for page := 0; ; page++ {
			if page > 100 {
				m.fatalf("history listing does not end")
			}
			hr, err := m.s.History(m.ctx, lease.HistoryRequest{Identity: id.id, PageSize: 1 + page%3, PageToken: token, DeadlineAt: rhFar})
			if err != nil {
				m.fatalf("%s: history: %v", when, err)
			}
			for _, e := range hr.Entries {
				listed = append(listed, e.Record.LeaseID)
				if e.Record.State != m.endState[e.Record.LeaseID] {
					m.fatalf("%s: listed %s in state %s, want %s", when, e.Record.LeaseID, e.Record.State, m.endState[e.Record.LeaseID])
				}
			}
			if token = hr.NextPageToken; token == "" {
				break
			}
		}
		slices.Reverse(listed)
		if !slices.Equal(listed, want) {
			m.fatalf("%s: %s lists history %v, want %v", when, id.id.TargetID, listed, want)
		}
	}
	// The lease-id lookups, read in a read transaction of their own (one
	// held across the API reads below could wait behind a flush forever).
	lookups := map[string]bool{}
	func() {
		tx, release, _, err := m.s.readTx()
		if err != nil {
			m.t.Fatal(err)
		}
		defer release()
		for leaseID := range m.ended {
			_, lookups[leaseID] = leaseLockKey(tx.Bucket(bucketLeases), leaseID)
		}
	}()
	actives := int64(0)
	for _, id := range m.idents {
		if id.active != nil {
			actives++
		}
	}
	if n, err := m.s.ActiveLeases(m.ctx); err != nil || n != actives {
		m.fatalf("%s: ActiveLeases %d, %v; the model holds %d", when, n, err, actives)
	}
	for leaseID, id := range m.ended {
		kept := slices.ContainsFunc(id.hist, func(e s37Ended) bool { return e.id == leaseID })
		// The lease-id lookup goes with the entry: none dangles.
		if ok := lookups[leaseID]; ok != kept {
			m.fatalf("%s: lookup of %s present %v, entry kept %v", when, leaseID, ok, kept)
		}
		res, err := m.s.Inspect(m.ctx, lease.InspectRequest{LeaseID: leaseID, DeadlineAt: rhFar})
		switch {
		case kept && (err != nil || res.Lease.State != m.endState[leaseID]):
			m.fatalf("%s: inspect of kept %s: %v %v, want state %s", when, leaseID, err, res.Lease, m.endState[leaseID])
		case !kept && code(err) != lease.CodeNotFound:
			m.fatalf("%s: inspect of dropped %s: %v, want not_found", when, leaseID, err)
		}
	}
}

// checkClosedFile compares the closed file itself with the model.
func (m *s37Model) checkClosedFile() {
	m.t.Helper()
	for _, id := range m.idents {
		ids, count, has := s37FileStored(m.t, m.path, id.lockKey)
		if len(ids) != len(id.hist) || (!id.uncounted && (has != (len(ids) > 0) || count != uint64(len(ids)))) {
			m.fatalf("closed file: %s holds %d entries, count %d (stored %v); model %d", id.id.TargetID, len(ids), count, has, len(id.hist))
		}
	}
}

// A randomized sequence of every request that ends leases (release,
// revoke, force-release, renewal or release of an expired lease, acquire
// over an expired lease, the delayed expiry cleanup, the reaper's expiry
// and retention), interleaved with reopening under another
// HistoryPerIdentity (1 included), crashes with writes only in the redo
// log, a file made schema 8 again, and backup → restore → recovery: after
// every step each identity's entries, count, listing and lease-id lookups
// are exactly the model's.
func TestReviewS37CountRandomizedModel(t *testing.T) {
	seeds := []int64{1, 2, 3, 4}
	if testing.Short() {
		seeds = seeds[:2]
	}
	seen := map[string]int{}
	defer func() {
		t.Logf("went through %v", seen)
		for _, k := range []string{"trim", "trim several", "trim uncounted", "retention", "retention uncounted", "retention to empty", "recovery ends", "crash"} {
			if !t.Failed() && seen[k] == 0 {
				t.Errorf("no seed went through %q", k)
			}
		}
	}()
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			bounds := []int{1, 2, 3, 5}
			flush := []time.Duration{-1, time.Hour, 5 * time.Millisecond}[seed%3]
			m := newS37Model(t, bounds[rng.Intn(len(bounds))], 20*time.Minute, 3, flush)
			m.checkFile = flush < 0
			ttls := []time.Duration{2 * time.Second, 10 * time.Second, 90 * time.Second}
			for i := 0; i < 220; i++ {
				id := m.idents[rng.Intn(len(m.idents))]
				switch r := rng.Intn(100); {
				case r < 30:
					m.acquire(id, ttls[rng.Intn(len(ttls))])
				case r < 42:
					m.end(id, "release")
				case r < 48:
					m.end(id, "revoke")
				case r < 54:
					m.end(id, "force")
				case r < 60:
					m.end(id, "renew")
				case r < 63:
					m.end(id, "expire")
				case r < 78:
					steps := []time.Duration{700 * time.Millisecond, 3 * time.Second, 20 * time.Second, 2 * time.Minute, 9 * time.Minute}
					m.c.Add(steps[rng.Intn(len(steps))])
					m.step("clock +")
				case r < 88:
					m.reap()
				case r < 93:
					m.reopen(bounds[rng.Intn(len(bounds))], rng.Intn(2) == 0)
				case r < 95:
					m.asSchema8()
				default:
					m.restore(bounds[rng.Intn(len(bounds))])
				}
				m.check(fmt.Sprintf("step %d", i))
			}
			// The long tail: every identity ends many more leases under the
			// last bound; the bound holds exactly.
			for round := 0; round < 12; round++ {
				for _, id := range m.idents {
					m.acquire(id, time.Minute)
					m.end(id, "release")
				}
			}
			m.check("tail")
			for k, v := range m.seen {
				seen[k] += v
			}
			for _, id := range m.idents {
				if len(id.hist) != m.o.HistoryPerIdentity {
					t.Fatalf("model keeps %d, bound %d", len(id.hist), m.o.HistoryPerIdentity)
				}
			}
		})
	}
}

// s37Ends acquires and releases n leases of target on s, returning their
// lease ids in order.
func s37Ends(t *testing.T, s *Store, prefix, target string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		a := rhAcquire(t, s, fmt.Sprintf("%s-acq-%d", prefix, i), target, nil)
		rhRelease(t, s, fmt.Sprintf("%s-rel-%d", prefix, i), a.Lease)
		ids = append(ids, a.Lease.LeaseID)
	}
	return ids
}

func s37LockKey(t *testing.T, target string) string {
	t.Helper()
	id := testIdentity
	id.TargetID = target
	_, key, err := lease.CanonicalLockKey(id, leasetest.StoreOptions().WithDefaults().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// s37Want fails unless s holds exactly want (oldest first) for lockKey,
// with the count wantCount (absent if wantCount is -1), and Inspect finds
// exactly those of all.
func s37Want(t *testing.T, s *Store, lockKey string, want, all []string, wantCount int, when string) {
	t.Helper()
	ids, n, has := storedHistory(t, s, lockKey)
	if !slices.Equal(ids, want) {
		t.Fatalf("%s: history %v, want %v", when, ids, want)
	}
	if wantCount < 0 && has || wantCount >= 0 && (!has || n != uint64(wantCount)) {
		t.Fatalf("%s: count %d (stored %v), want %d", when, n, has, wantCount)
	}
	for _, id := range all {
		_, err := s.Inspect(context.Background(), lease.InspectRequest{LeaseID: id, DeadlineAt: rhFar})
		if kept := slices.Contains(want, id); kept && err != nil || !kept && code(err) != lease.CodeNotFound {
			t.Fatalf("%s: inspect of %s (kept %v): %v", when, id, kept, err)
		}
	}
}

// Ends only the redo log holds (no flush) are redone after a crash with
// their counts; reopening under a lower bound trims at the identity's
// next end, exactly to it; a second crash, under a higher bound, keeps
// growing to that bound. The closed file agrees with the store.
func TestReviewS37CountCrashReplayAcrossBounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s37.db")
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 3
	open := func(bound int) *Store {
		o.HistoryPerIdentity = bound
		s, err := Open(path, Options{StoreOptions: o, ReapInterval: -1, FlushInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	key := s37LockKey(t, "s37-crash")
	s := open(3)
	all := s37Ends(t, s, "c1", "s37-crash", 5)
	s37Want(t, s, key, all[2:], all, 3, "before the crash")
	crash(t, s)
	if ids, _, _ := s37FileStored(t, path, key); len(ids) != 0 {
		t.Fatalf("the tree took unflushed writes: %v", ids)
	}
	s = open(2)
	s37Want(t, s, key, all[2:], all, 3, "redone under a lower bound, before the next end")
	more := s37Ends(t, s, "c2", "s37-crash", 1)
	all = append(all, more...)
	s37Want(t, s, key, all[4:], all, 2, "after the first end under bound 2")
	crash(t, s)
	s = open(4)
	s37Want(t, s, key, all[4:], all, 2, "redone again")
	all = append(all, s37Ends(t, s, "c3", "s37-crash", 3)...)
	s37Want(t, s, key, all[5:], all, 4, "grown to bound 4")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ids, n, has := s37FileStored(t, path, key); len(ids) != 4 || !has || n != 4 {
		t.Fatalf("closed file: %d entries, count %d (stored %v)", len(ids), n, has)
	}
}

// A batch whose append to the redo log fails is rolled back whole (its
// trim and count too); after the crash the identity ends its lease
// normally and loses exactly its oldest entry.
func TestReviewS37CountFailedAppendRollsBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s37.db")
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 3
	s, err := Open(path, Options{StoreOptions: o, ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := s37LockKey(t, "s37-append")
	all := s37Ends(t, s, "a1", "s37-append", 3)
	a := rhAcquire(t, s, "a2-acq", "s37-append", nil)
	e := s.group.engine
	e.logMu.Lock()
	_ = e.log.Close()
	e.logMu.Unlock()
	rel := lease.ReleaseRequest{Identity: a.Lease.Identity(), LeaseID: a.Lease.LeaseID, FencingToken: a.Lease.FencingToken,
		ServiceInstanceID: a.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "a2-rel", DeadlineAt: rhFar, Caller: callerOfRecord(a.Lease)}}
	if _, err := s.Release(ctx, rel); code(err) != lease.CodeOutcomeUnknown {
		t.Fatalf("release whose append failed: %v", err)
	}
	s37Want(t, s, key, all, all, 3, "after the failed append")
	crash(t, s)
	s, err = Open(path, Options{StoreOptions: o, ReapInterval: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s37Want(t, s, key, all, all, 3, "reopened")
	rel.RequestID = "a2-rel-again"
	if _, err := s.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	all = append(all, a.Lease.LeaseID)
	s37Want(t, s, key, all[1:], all, 3, "released after reopening")
}

// In one group commit, a batch-mate that archives the identity's lease
// (trimming its oldest entry and writing its count) and then fails is
// rolled back alone; the real release in the same batch trims exactly
// one entry and counts right.
func TestReviewS37CountFailingBatchMate(t *testing.T) {
	ctx := context.Background()
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 2
	s := openTemp(t, Options{StoreOptions: o, ReapInterval: -1})
	key := s37LockKey(t, "s37-batch")
	all := s37Ends(t, s, "b1", "s37-batch", 2)
	a := rhAcquire(t, s, "b2-acq", "s37-batch", nil)
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failure below must not leave the committer waiting
	first := gate(t, &s.group, release)
	poison := make(chan error, 2)
	go func() {
		poison <- s.mutate(ctx, func(tx *layered.View) error {
			if err := s.archive(tx, a.Lease, lease.StateRevoked, lease.At(time.Now()), ended{by: "poison"}); err != nil {
				return err
			}
			return lease.Errorf(lease.CodeCorrupt, "a batch-mate that fails after archiving")
		})
	}()
	waitQueued(t, &s.group, 1)
	relErr := make(chan error, 1)
	go func() {
		_, err := s.Release(ctx, lease.ReleaseRequest{Identity: a.Lease.Identity(), LeaseID: a.Lease.LeaseID, FencingToken: a.Lease.FencingToken,
			ServiceInstanceID: a.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "b2-rel", DeadlineAt: rhFar, Caller: callerOfRecord(a.Lease)}})
		relErr <- err
	}()
	waitQueued(t, &s.group, 2)
	go func() {
		poison <- s.mutate(ctx, func(tx *layered.View) error {
			if err := s.archive(tx, a.Lease, lease.StateRevoked, lease.At(time.Now()), ended{by: "poison"}); err != nil {
				return err
			}
			panic("a batch-mate that panics after archiving")
		})
	}()
	waitQueued(t, &s.group, 3)
	open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-poison; err == nil {
			t.Fatal("a failing batch-mate succeeded")
		}
	}
	if err := <-relErr; err != nil {
		t.Fatalf("release in the batch: %v", err)
	}
	all = append(all, a.Lease.LeaseID)
	s37Want(t, s, key, all[1:], all, 2, "after the batch")
	res, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: rhFar})
	if err != nil || res.Lease.State != lease.StateReleased {
		t.Fatalf("the released lease: %v %v", err, res.Lease)
	}
	more := s37Ends(t, s, "b3", "s37-batch", 1)
	all = append(all, more...)
	s37Want(t, s, key, all[2:], all, 2, "after one more end")
}

// Files of schema 2 and 6 (made from today's state by the test helpers,
// so no count) and a schema 8 backup restored: history beyond the bound
// stays, listed whole, until the identity's next end, which counts it
// and trims it to the bound in one go; an identity that ends nothing
// keeps no count and its history, and retention of an uncounted
// identity's entries writes no count.
func TestReviewS37CountOlderSchemasBeyondTheBound(t *testing.T) {
	ctx := context.Background()
	for _, from := range []string{"schema2", "schema6", "schema8-restore"} {
		t.Run(from, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "old.db")
			c := &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
			o := leasetest.StoreOptions()
			o.HistoryPerIdentity, o.HistoryRetention = 10, time.Hour
			s, err := Open(path, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1, FlushInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			kx, ky, kz := s37LockKey(t, "s37-x"), s37LockKey(t, "s37-y"), s37LockKey(t, "s37-z")
			old := s37Ends(t, s, "z", "s37-z", 2) // retired below
			c.Add(50 * time.Minute)
			xs := s37Ends(t, s, "x", "s37-x", 7)
			ys := s37Ends(t, s, "y", "s37-y", 2)
			live := rhAcquire(t, s, "x-live", "s37-x", nil)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			o.HistoryPerIdentity = 3
			switch from {
			case "schema2":
				downgradeToV2(t, path)
			case "schema6", "schema8-restore":
				db, err := bbolt.Open(path, 0o600, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := db.Update(func(tx *bbolt.Tx) error {
					if from == "schema6" {
						return asSchema(tx, schemaVersionV6)
					}
					for _, k := range []string{kx, ky, kz} {
						if err := tx.Bucket(bucketIdent).Delete(historyCountKey(k)); err != nil {
							return err
						}
					}
					return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaVersionV8))
				}); err != nil {
					t.Fatal(err)
				}
				db.Close()
			}
			opts := Options{StoreOptions: o, Now: c.Now, ReapInterval: -1, FlushInterval: -1}
			if from == "schema8-restore" {
				target := filepath.Join(dir, "restored.db")
				ns := NewNamespace(target, opts)
				if _, err := ns.Restore(ctx, bytes.NewReader(rhBackup(t, path, c.Now()))); err != nil {
					t.Fatalf("restore of a schema 8 backup: %v", err)
				}
				cl, err := ns.OpenClosed(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// Recovery revokes the live lease of x: x's first end.
				if _, err := cl.Finish(ctx, lease.RecoveryPlan{Epoch: 1, Reason: "s37"}); err != nil {
					t.Fatal(err)
				}
				path = target
			}
			s, err = Open(path, opts)
			if err != nil {
				t.Fatalf("open the %s file: %v", from, err)
			}
			defer s.Close()
			allX := append(slices.Clone(xs), live.Lease.LeaseID)
			if from == "schema8-restore" {
				s37Want(t, s, kx, allX[len(allX)-3:], allX, 3, "x after recovery ended its lease")
			} else {
				s37Want(t, s, kx, xs, xs, -1, "x before its next end")
				hr, err := s.History(ctx, lease.HistoryRequest{Identity: live.Lease.Identity(), PageSize: 50, DeadlineAt: rhFar})
				if err != nil || len(hr.Entries) != 7 {
					t.Fatalf("listing before the next end: %d entries, %v", len(hr.Entries), err)
				}
				rhRelease(t, s, "x-live-rel", live.Lease)
				s37Want(t, s, kx, allX[len(allX)-3:], allX, 3, "x after its first end")
			}
			s37Want(t, s, ky, ys, ys, -1, "y, which ended nothing")
			s37Want(t, s, kz, old, old, -1, "z, before retention")
			// Retention of z's entries (ended more than an hour ago) and of
			// one of y's: no count is made for them.
			c.Add(11 * time.Minute)
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
			s37Want(t, s, kz, nil, old, -1, "z after retention")
			s37Want(t, s, ky, ys, ys, -1, "y after retention (none due)")
			ys = append(ys, s37Ends(t, s, "y2", "s37-y", 2)...)
			s37Want(t, s, ky, ys[1:], ys, 3, "y after two ends")
			old = append(old, s37Ends(t, s, "z2", "s37-z", 1)...)
			s37Want(t, s, kz, old[2:], old, 1, "z after retention emptied it, then one end")
		})
	}
}

// A history entry that no longer decodes is trimmed, which leaves its
// retention index entry (its end is unknown); retention reaching that
// stale index entry must not count a kept entry out, or the identity
// would keep more than the bound from then on.
func TestReviewS37CountStaleRetentionOfTrimmedCorruptEntry(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity, o.HistoryRetention = 3, time.Hour
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1, FlushInterval: -1})
	key := s37LockKey(t, "s37-corrupt")
	all := s37Ends(t, s, "k1", "s37-corrupt", 3)
	keys, _ := rhEntries(t, s, key)
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(keys[0], []byte("not history")) }); err != nil {
		t.Fatal(err)
	}
	c.Add(30 * time.Minute)
	all = append(all, s37Ends(t, s, "k2", "s37-corrupt", 1)...)
	// The corrupt entry was trimmed; its lease's lookup stays (it could not
	// be read), so only the kept ones are checked.
	s37Want(t, s, key, all[1:], all[1:], 3, "after trimming the corrupt entry")
	c.Add(31 * time.Minute) // past the first three's retention: the stale index entry is due
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	s37Want(t, s, key, all[3:], all[1:], 1, "after retention")
	all = append(all, s37Ends(t, s, "k3", "s37-corrupt", 4)...)
	s37Want(t, s, key, all[len(all)-3:], all[1:], 3, "after four more ends")
}

// HistoryPerIdentity 1: every end replaces the one entry, whatever ended
// it, and the count stays 1.
func TestReviewS37CountBoundOne(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 1
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	key := s37LockKey(t, "s37-one")
	var all []string
	for i := 0; i < 6; i++ {
		a := rhAcquire(t, s, fmt.Sprintf("one-acq-%d", i), "s37-one", nil)
		all = append(all, a.Lease.LeaseID)
		switch i % 3 {
		case 0:
			rhRelease(t, s, fmt.Sprintf("one-rel-%d", i), a.Lease)
		case 1:
			if _, err := s.ForceRelease(ctx, rhAdminReq(fmt.Sprintf("one-force-%d", i), a.Lease, "s37", "inc")); err != nil {
				t.Fatal(err)
			}
		default:
			c.Add(2 * time.Minute)
			if err := s.reap(ctx); err != nil {
				t.Fatal(err)
			}
		}
		s37Want(t, s, key, all[i:], all, 1, fmt.Sprintf("end %d", i))
	}
}

// A damaged count of the largest value ("above the entries") must still
// leave the identity at its bound: trimHistory promises a count found
// higher than the entries is corrected. The count plus the entry just
// written wraps to 0, nothing is trimmed, 0 is stored, and from then on
// the identity keeps its bound plus the entries it had.
func TestReviewS37CountMaxValueWraps(t *testing.T) {
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 3
	s := openTemp(t, Options{StoreOptions: o, ReapInterval: -1, FlushInterval: -1})
	key := s37LockKey(t, "s37-wrap")
	all := s37Ends(t, s, "w1", "s37-wrap", 3)
	setHistoryCount(t, s, key, u64(^uint64(0)))
	all = append(all, s37Ends(t, s, "w2", "s37-wrap", 5)...)
	ids, n, _ := storedHistory(t, s, key)
	if len(ids) > 3 {
		t.Fatalf("a count of 2^64-1 breaks the bound: %d entries kept (bound 3), count %d", len(ids), n)
	}
	if n != uint64(len(ids)) {
		t.Fatalf("count %d for %d entries", n, len(ids))
	}
	if want := all[len(all)-3:]; !slices.Equal(ids, want) {
		t.Fatalf("kept %v, want the newest three %v", ids, want)
	}
}

// Many writers end leases of a few identities at once (release, revoke,
// force-release, renewals, leases left to expire) while the reaper runs
// expiry and retention on a fast clock: group commits mix archives,
// trims and retention drops of the same identities. Afterwards (and after
// one more retention pass) every identity's count equals its entries,
// within the bound; the kept entries are the newest ended leases (by
// fencing token) with no gap, and fewer than the bound only when the one
// before them ended long enough ago for retention to have taken it (else
// it was over-trimmed: lost evidence); every entry keeps its lookup and
// no lookup dangles. Then ending bound+1 leases leaves exactly the newest
// bound.
func TestReviewS37CountConcurrentWritersAndReaper(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity, o.HistoryRetention = 3, 90*time.Second
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: 2 * time.Millisecond, FlushInterval: 3 * time.Millisecond})
	targets := []string{"s37-con-0", "s37-con-1", "s37-con-2", "s37-con-3"}
	type ended struct {
		token   uint64
		leaseID string
		ms      int64 // ended_at: the end's backend time, or the expiry
	}
	var mu sync.Mutex
	byTarget := map[string][]ended{}
	unsure := map[string]bool{} // an end whose outcome is unknown
	stop := make(chan struct{})
	var tick sync.WaitGroup
	tick.Add(1)
	go func() {
		defer tick.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				c.Add(700 * time.Millisecond)
			}
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 150; i++ {
				target := targets[rng.Intn(len(targets))]
				req := acquireReq(fmt.Sprintf("con-%d-%d", w, i), time.Duration(1+rng.Intn(5))*time.Second, rhFar)
				req.Identity.TargetID = target
				a, err := s.Acquire(ctx, req)
				if err != nil {
					continue
				}
				r := a.Lease
				e := ended{token: r.FencingToken, leaseID: r.LeaseID, ms: r.ExpiresAt.UnixMilli()}
				rid := fmt.Sprintf("con-%d-%d-end", w, i)
				var res lease.Result
				op := rng.Intn(5)
				switch op {
				case 0:
					res, err = s.Release(ctx, lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
						ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: rid, DeadlineAt: rhFar, Caller: callerOfRecord(r)}})
				case 1:
					res, err = s.Revoke(ctx, rhAdminReq(rid, r, "s37", "inc"))
				case 2:
					res, err = s.ForceRelease(ctx, rhAdminReq(rid, r, "s37", "inc"))
				case 3:
					res, err = s.Renew(ctx, lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
						ServiceInstanceID: r.ServiceInstanceID, TTL: time.Second,
						Mutation: lease.Mutation{RequestID: rid, DeadlineAt: rhFar, Caller: callerOfRecord(r)}})
				}
				mu.Lock()
				switch {
				case op == 4, code(err) == lease.CodeLost:
					// Left to expire, or expired before the end: archived
					// at its expiry.
				case err != nil:
					unsure[target] = true
				case op == 3:
					e.ms = res.Lease.ExpiresAt.UnixMilli()
				default:
					e.ms = res.BackendTime.UnixMilli()
				}
				byTarget[target] = append(byTarget[target], e)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	tick.Wait()
	path := s.db.Path()
	s.Close() // stops the reaper; everything flushed
	s, err := Open(path, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1, FlushInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// More passes, 5 s apart, from well inside the retention of the newest
	// ends to past it: they expire what is due and retire the kept entries
	// oldest first; after each the invariants hold.
	total, short := 0, 0
	c.Add(55 * time.Second)
	for pass := 0; pass < 9; pass++ {
		c.Add(5 * time.Second)
		if err := s.reap(ctx); err != nil {
			t.Fatal(err)
		}
		cutoff := lease.At(c.Now()).UnixMilli() - o.HistoryRetention.Milliseconds() - 1
		for _, target := range targets {
			key := s37LockKey(t, target)
			ids, n, has := storedHistory(t, s, key)
			if pass == 0 {
				total += len(ids)
			}
			if len(ids) > 3 || has != (len(ids) > 0) || n != uint64(len(ids)) {
				t.Fatalf("pass %d: %s: %d entries, count %d (stored %v)", pass, target, len(ids), n, has)
			}
			for _, id := range ids {
				if got, ok := leaseLockKeyOf(t, s, id); !ok || got != key {
					t.Fatalf("pass %d: %s: kept entry %s has no lookup", pass, target, id)
				}
			}
			if unsure[target] {
				continue
			}
			all := byTarget[target]
			slices.SortFunc(all, func(a, b ended) int { return int(a.token) - int(b.token) })
			// Every lease the workers got was ended by now (the first pass
			// expired the rest): the kept entries are the newest of them,
			// no gap.
			if len(ids) > len(all) {
				t.Fatalf("%s: %d entries for %d leases", target, len(ids), len(all))
			}
			suffix := all[len(all)-len(ids):]
			for i, e := range suffix {
				if ids[i] != e.leaseID {
					t.Fatalf("pass %d: %s: kept %v, not the newest ended leases (want %s at %d)", pass, target, ids, e.leaseID, i)
				}
			}
			if len(ids) < 3 && len(ids) < len(all) {
				short++
				if prev := all[len(all)-len(ids)-1]; prev.ms > cutoff {
					t.Fatalf("pass %d: %s: only %d entries kept, but %s (token %d) ended at %d, after the retention cutoff %d: over-trimmed",
						pass, target, len(ids), prev.leaseID, prev.token, prev.ms, cutoff)
				}
			}
		}
	}
	t.Logf("%d entries kept, %d times an identity was below the bound after retention", total, short)
	if short == 0 {
		t.Fatal("retention never took a kept entry")
	}
	var lookups []string
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketLeases).ForEach(func(k, _ []byte) error {
			lookups = append(lookups, string(k))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range lookups {
		if _, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: rhFar}); err != nil {
			t.Errorf("lookup of %s dangles: %v", id, err)
		}
	}
	if total == 0 {
		t.Fatal("nothing kept: the run ended nothing")
	}
	c.Add(time.Hour)
	for _, target := range targets {
		key := s37LockKey(t, target)
		var all []string
		for i := 0; i < 4; i++ {
			a := rhAcquire(t, s, fmt.Sprintf("con-tail-%s-%d", target, i), target, nil)
			rhRelease(t, s, fmt.Sprintf("con-tail-rel-%s-%d", target, i), a.Lease)
			all = append(all, a.Lease.LeaseID)
		}
		ids, n, _ := storedHistory(t, s, key)
		if !slices.Equal(ids, all[1:]) || n != 3 {
			t.Fatalf("%s after the tail: %v, count %d; want %v", target, ids, n, all[1:])
		}
	}
}
