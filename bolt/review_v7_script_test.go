package bolt

// Review of schema 7 (commit 1a791ca), part 1: a differential script that
// compiles against both the schema 6 build (f8e39a3) and the schema 7
// build. The schema 6 build wrote a rich store file with r7Build, a backup
// of it, and what r7Observe and r7Recover observe on them
// (testdata/review7, gzipped); the schema 7 build migrates the same file
// and must observe exactly the same results (TestReview7Differential in
// review_v7_test.go). The same goes for recovery from the backup. In the
// review, the schema 6 build also refused the schema 7 file and backup
// without changing them.

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

var (
	r7Base      = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r7ObserveAt = r7Base.Add(2 * time.Hour) // the observe phase's clock
	r7Far       = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	r7Owners    = []string{"prn-r7-a", "prn-r7-b"}
)

const r7LongTTL = 20 * time.Hour // still live at r7ObserveAt

func r7Opts(c *clock) Options {
	return Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
}

func r7Ident(program, target string) lease.Identity {
	return lease.Identity{TenantID: "tenant-r7", ProgramID: program, TargetNamespace: "ns-r7", TargetID: target, ActorName: "actor-r7"}
}

// r7Digest is the 32 bytes a lock key's text carries.
func r7Digest(t testing.TB, id lease.Identity) []byte {
	t.Helper()
	_, k, err := lease.CanonicalLockKey(id, leasetest.StoreOptions().OperationClasses)
	if err != nil {
		t.Fatal(err)
	}
	d, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, lease.KeyPrefix))
	if err != nil || len(d) != 32 {
		t.Fatalf("lock key %q: %v", k, err)
	}
	return d
}

// r7Targets picks targets whose packed lock keys sit at the edges of the
// key space or next to each other: first byte 0x00 and 0xff (two each, so
// two identities are neighbours at each end), last byte 0x00 and 0xff, a
// 0xff 0xff pair inside, two sharing their first two bytes, and ordinary
// ones. Deterministic, so both builds pick the same.
func r7Targets(t testing.TB) []string {
	t.Helper()
	want := map[string]int{"first00": 2, "firstff": 2, "last00": 1, "lastff": 1, "ffff": 1}
	var out []string
	seen2 := map[string]string{}
	shared := false
	for i := 0; i < 20000 && (len(want) > 0 || !shared); i++ {
		target := fmt.Sprintf("x-%d", i)
		d := r7Digest(t, r7Ident("prog-1", target))
		var class string
		switch {
		case d[0] == 0x00:
			class = "first00"
		case d[0] == 0xff:
			class = "firstff"
		case d[31] == 0x00:
			class = "last00"
		case d[31] == 0xff:
			class = "lastff"
		case bytes.Contains(d, []byte{0xff, 0xff}):
			class = "ffff"
		}
		if want[class] > 0 {
			want[class]--
			if want[class] == 0 {
				delete(want, class)
			}
			out = append(out, target)
			continue
		}
		if !shared {
			if other, ok := seen2[string(d[:2])]; ok {
				out = append(out, other, target)
				shared = true
				continue
			}
			seen2[string(d[:2])] = target
		}
	}
	if len(want) > 0 || !shared {
		t.Fatalf("no targets for %v (shared %v)", want, shared)
	}
	return append(out, "plain-1", "plain-2", "plain-3")
}

type r7World struct {
	t      *testing.T
	s      *Store
	c      *clock
	out    []string
	labels map[string]string
	nlabel int
	recs   map[string]*lease.Record // label → the latest record seen
}

func newR7World(t *testing.T, s *Store, c *clock) *r7World {
	return &r7World{t: t, s: s, c: c, labels: map[string]string{}, recs: map[string]*lease.Record{}}
}

func (w *r7World) note(format string, a ...any) { w.out = append(w.out, fmt.Sprintf(format, a...)) }

func (w *r7World) label(id string) string {
	if id == "" {
		return "-"
	}
	l, ok := w.labels[id]
	if !ok {
		w.nlabel++
		l = fmt.Sprintf("L%03d", w.nlabel)
		w.labels[id] = l
	}
	return l
}

func (w *r7World) rec(r *lease.Record) string {
	if r == nil {
		return "nil"
	}
	l := w.label(r.LeaseID)
	if r.State == lease.StateActive {
		w.recs[l] = r
	}
	return fmt.Sprintf("%s tok=%d st=%s acq=%d ren=%d exp=%d own=%s inst=%s exec=%s job=%s %s/%s lk=%s req=%s",
		l, r.FencingToken, r.State, r.AcquiredAt.UnixMilli(), r.RenewedAt.UnixMilli(), r.ExpiresAt.UnixMilli(),
		r.OwnerPrincipalID, r.ServiceInstanceID, r.ExecutionID, r.JobID, r.ProgramID, r.TargetID, r.LockKey, r.RequestID)
}

func (w *r7World) res(what string, r lease.Result, err error) {
	if err != nil {
		w.note("%s: err %s", what, lease.CodeOf(err))
		return
	}
	w.note("%s: %s replayed=%v op=%s at=%d lease={%s} current={%s}", what, r.Code, r.Replayed, r.Op, r.BackendTime.UnixMilli(),
		w.rec(r.Lease), w.rec(r.Current))
}

func (w *r7World) step() { w.c.Add(10 * time.Millisecond) }

func caller(owner string) lease.Caller {
	return lease.Caller{PrincipalID: owner, ClientID: "client-1", CredentialID: "key-1"}
}

func r7Acq(id lease.Identity, owner, reqID string, ttl time.Duration) lease.AcquireRequest {
	return lease.AcquireRequest{Identity: id, ServiceInstanceID: "instance-1", TTL: ttl, MaximumLifetime: 5 * 24 * time.Hour,
		ExecutionID: "execution-1", JobID: "job-1",
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: r7Far, Caller: caller(owner)}}
}

func (w *r7World) acquire(id lease.Identity, owner, reqID string, ttl time.Duration) *lease.Record {
	w.step()
	r, err := w.s.Acquire(context.Background(), r7Acq(id, owner, reqID, ttl))
	w.res("acquire "+reqID, r, err)
	if err != nil {
		return nil
	}
	return r.Lease
}

func (w *r7World) renew(r *lease.Record, reqID string, ttl time.Duration) *lease.Record {
	w.step()
	res, err := w.s.Renew(context.Background(), lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID,
		FencingToken: r.FencingToken, TTL: ttl, ServiceInstanceID: r.ServiceInstanceID,
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: r7Far, Caller: callerOfRecord(r)}})
	w.res("renew "+reqID, res, err)
	if err != nil {
		return r
	}
	return res.Lease
}

func (w *r7World) release(r *lease.Record, reqID string) {
	w.step()
	res, err := w.s.Release(context.Background(), releaseOf(r, reqID, r7Far))
	w.res("release "+reqID, res, err)
}

func (w *r7World) admin(op lease.Op, r *lease.Record, reqID string) {
	w.step()
	req := lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		Reason: "review7 " + string(op), IncidentID: "inc-" + reqID,
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: r7Far, Caller: caller("prn-r7-admin")}}
	var res lease.Result
	var err error
	if op == lease.OpRevoke {
		res, err = w.s.Revoke(context.Background(), req)
	} else {
		res, err = w.s.ForceRelease(context.Background(), req)
	}
	w.res(string(op)+" "+reqID, res, err)
}

func (w *r7World) commit(r *lease.Record, token uint64, commitID string, replayOnly bool) {
	w.step()
	res, err := w.s.AuthorizeCommit(context.Background(), lease.CommitRequest{Identity: r.Identity(), LeaseID: r.LeaseID,
		FencingToken: token, ServiceInstanceID: r.ServiceInstanceID, Sink: "couchdb", CommitID: commitID,
		ExecutionID: r.ExecutionID, JobID: r.JobID, Target: "doc-" + commitID, DeadlineAt: r7Far,
		Caller: callerOfRecord(r), ReplayOnly: replayOnly})
	if err != nil {
		w.note("commit %s only=%v: err %s", commitID, replayOnly, lease.CodeOf(err))
		return
	}
	w.note("commit %s only=%v: %s replayed=%v seq=%d tok=%d lease=%s at=%d", commitID, replayOnly, res.Code, res.Replayed,
		res.Commit.Seq, res.Commit.FencingToken, w.label(res.Commit.LeaseID), res.Commit.AcceptedAt.UnixMilli())
}

// r7Build writes the story into a new store (run by the schema 6 build).
func r7Build(t *testing.T, s *Store, c *clock) (*r7World, []byte) {
	w := newR7World(t, s, c)
	// History sequences cross a byte boundary (0xff → 0x100).
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).SetSequence(0xf0) }); err != nil {
		t.Fatal(err)
	}
	for i, target := range r7Targets(t) {
		owner := r7Owners[i%2]
		prog := []string{"prog-1", "prog-2"}[i%2]
		id := r7Ident(prog, target)
		r1 := w.acquire(id, owner, fmt.Sprintf("b-acq-%d-1", i), time.Hour)
		r1 = w.renew(r1, fmt.Sprintf("b-ren-%d-1", i), 2*time.Hour)
		w.commit(r1, r1.FencingToken, fmt.Sprintf("b-com-%d-1", i), false)
		w.release(r1, fmt.Sprintf("b-rel-%d-1", i))
		switch i % 4 {
		case 0: // released twice
			r2 := w.acquire(id, owner, fmt.Sprintf("b-acq-%d-2", i), time.Hour)
			w.commit(r2, r2.FencingToken, fmt.Sprintf("b-com-%d-2", i), false)
			w.release(r2, fmt.Sprintf("b-rel-%d-2", i))
		case 1: // live
			r2 := w.acquire(id, owner, fmt.Sprintf("b-acq-%d-2", i), r7LongTTL)
			w.commit(r2, r2.FencingToken, fmt.Sprintf("b-com-%d-2", i), false)
		case 2: // expires unreaped (its index entries stay)
			w.acquire(id, owner, fmt.Sprintf("b-acq-%d-2", i), 10*time.Second)
		case 3: // ended by an administrator
			r2 := w.acquire(id, owner, fmt.Sprintf("b-acq-%d-2", i), time.Hour)
			w.admin([]lease.Op{lease.OpForceRelease, lease.OpRevoke}[(i/4)%2], r2, fmt.Sprintf("b-adm-%d-2", i))
		}
	}
	// One identity past HistoryPerIdentity: its oldest entries and their
	// lease-id lookups are trimmed.
	hot := r7Ident("prog-1", "hot")
	for j := range 12 {
		r := w.acquire(hot, r7Owners[0], fmt.Sprintf("b-hot-acq-%d", j), time.Hour)
		w.release(r, fmt.Sprintf("b-hot-rel-%d", j))
	}
	// Many stale index entries under one owner, then live leases after
	// them: List must get past them with its page tokens.
	for j := range 80 {
		w.acquire(r7Ident("prog-3", fmt.Sprintf("stale-%d", j)), "prn-r7-c", fmt.Sprintf("b-stale-%d", j), 10*time.Second)
	}
	for j := range 3 {
		w.acquire(r7Ident("prog-3", fmt.Sprintf("fresh-%d", j)), "prn-r7-c", fmt.Sprintf("b-fresh-%d", j), r7LongTTL)
	}
	// The backup recovery restores, taken before the corrupt record (a
	// restored corrupt record fails recovery closed, by design).
	var backup bytes.Buffer
	if _, err := s.Backup(context.Background(), &backup); err != nil {
		t.Fatal(err)
	}
	// A corrupt active record: quarantined by the next acquisition.
	bad := r7Ident("prog-1", "corrupt")
	rb := w.acquire(bad, r7Owners[0], "b-bad-acq", r7LongTTL)
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdent).Put(activeKey(rb.LockKey), []byte("rv2\nnot a record"))
	}); err != nil {
		t.Fatal(err)
	}
	w.acquire(bad, r7Owners[1], "b-bad-acq-2", time.Hour)
	w.note("quarantine: %v", r7Quarantine(t, s))
	return w, backup.Bytes()
}

func r7Quarantine(t *testing.T, s *Store) []string {
	var out []string
	if err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketQuarantine).ForEach(func(k, v []byte) error { out = append(out, string(k)+"="+string(v)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func r7HighWater(t *testing.T, s *Store) []string {
	var out []string
	if err := s.db.View(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketHighWater, bucketCommitSeq} {
			if err := tx.Bucket(b).ForEach(func(k, v []byte) error { out = append(out, fmt.Sprintf("%s %q=%x", b, k, v)); return nil }); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// r7Identities are every identity the build touched, in a fixed order.
func r7Identities(t testing.TB) []lease.Identity {
	var ids []lease.Identity
	for i, target := range r7Targets(t) {
		ids = append(ids, r7Ident([]string{"prog-1", "prog-2"}[i%2], target))
	}
	ids = append(ids, r7Ident("prog-1", "hot"), r7Ident("prog-1", "corrupt"))
	for j := range 80 {
		ids = append(ids, r7Ident("prog-3", fmt.Sprintf("stale-%d", j)))
	}
	for j := range 3 {
		ids = append(ids, r7Ident("prog-3", fmt.Sprintf("fresh-%d", j)))
	}
	return ids
}

func (w *r7World) reads(phase string) {
	ctx := context.Background()
	ids := r7Identities(w.t)
	for n, id := range ids {
		in, err := w.s.Inspect(ctx, lease.InspectRequest{Identity: id, DeadlineAt: r7Far})
		w.res(fmt.Sprintf("%s inspect id %d", phase, n), in, err)
		for _, size := range []int{3, 50} {
			tok, page := "", 0
			for {
				h, err := w.s.History(ctx, lease.HistoryRequest{Identity: id, PageSize: size, PageToken: tok, DeadlineAt: r7Far})
				if err != nil {
					w.note("%s history %d/%d page %d: err %s", phase, n, size, page, lease.CodeOf(err))
					break
				}
				for _, e := range h.Entries {
					w.note("%s history %d/%d page %d: %s ended=%d by=%s req=%s reason=%s inc=%s", phase, n, size, page,
						w.rec(e.Record), e.EndedAt.UnixMilli(), e.EndedBy, e.RequestID, e.Reason, e.IncidentID)
				}
				w.note("%s history %d/%d page %d token %q", phase, n, size, page, h.NextPageToken)
				if h.NextPageToken == "" || page > 20 {
					break
				}
				tok, page = h.NextPageToken, page+1
			}
		}
	}
	// Inspect by every lease id seen so far, in label order.
	var known []string
	for id := range w.labels {
		known = append(known, id)
	}
	sort.Slice(known, func(i, j int) bool { return w.labels[known[i]] < w.labels[known[j]] })
	for _, id := range known {
		in, err := w.s.Inspect(ctx, lease.InspectRequest{LeaseID: id, DeadlineAt: r7Far})
		w.res(phase+" inspect lease "+w.label(id), in, err)
	}
	// Lookups of every build request.
	for i := range r7Targets(w.t) {
		id := ids[i]
		owner := r7Owners[i%2]
		for _, q := range []struct {
			op  lease.Op
			req string
		}{{lease.OpAcquire, "b-acq-%d-1"}, {lease.OpRenew, "b-ren-%d-1"}, {lease.OpRelease, "b-rel-%d-1"},
			{lease.OpAcquire, "b-acq-%d-2"}, {lease.OpRelease, "b-rel-%d-2"}, {lease.OpAcquire, "o-acq-%d"}} {
			reqID := fmt.Sprintf(q.req, i)
			r, err := w.s.LookupRequest(ctx, lease.LookupRequest{Op: q.op, Identity: id, RequestID: reqID, PrincipalID: owner, DeadlineAt: r7Far})
			w.res(phase+" lookup "+reqID, r, err)
		}
		for _, op := range []lease.Op{lease.OpForceRelease, lease.OpRevoke} {
			reqID := fmt.Sprintf("b-adm-%d-2", i)
			r, err := w.s.LookupRequest(ctx, lease.LookupRequest{Op: op, Identity: id, RequestID: reqID, PrincipalID: "prn-r7-admin", DeadlineAt: r7Far})
			w.res(phase+" lookup "+string(op)+" "+reqID, r, err)
		}
	}
	for j := range 12 {
		for _, q := range []struct {
			op  lease.Op
			req string
		}{{lease.OpAcquire, "b-hot-acq-%d"}, {lease.OpRelease, "b-hot-rel-%d"}} {
			reqID := fmt.Sprintf(q.req, j)
			r, err := w.s.LookupRequest(ctx, lease.LookupRequest{Op: q.op, Identity: r7Ident("prog-1", "hot"), RequestID: reqID,
				PrincipalID: r7Owners[0], DeadlineAt: r7Far})
			w.res(phase+" lookup "+reqID, r, err)
		}
	}
	// List, every filter, several page sizes.
	filters := []lease.ListRequest{
		{By: lease.ListByOwner, OwnerPrincipalID: r7Owners[0]}, {By: lease.ListByOwner, OwnerPrincipalID: r7Owners[1]},
		{By: lease.ListByOwner, OwnerPrincipalID: "prn-r7-c"}, {By: lease.ListByOwner, OwnerPrincipalID: "prn-r7-nobody"},
		{By: lease.ListByProgram, TenantID: "tenant-r7", ProgramID: "prog-1"}, {By: lease.ListByProgram, TenantID: "tenant-r7", ProgramID: "prog-2"},
		{By: lease.ListByProgram, TenantID: "tenant-r7", ProgramID: "prog-3"},
	}
	for _, id := range ids {
		filters = append(filters, lease.ListRequest{By: lease.ListByTarget, TenantID: id.TenantID, ProgramID: id.ProgramID,
			TargetNamespace: id.TargetNamespace, TargetID: id.TargetID})
	}
	for fi, f := range filters {
		for _, size := range []int{1, 2, 50} {
			w.note("%s list %d/%d: %s", phase, fi, size, w.list(f, size))
		}
	}
	n, err := w.s.ActiveLeases(ctx)
	w.note("%s active leases: %d %v", phase, n, lease.CodeOf(err))
}

// list pages through one filter and returns the labels it listed, sorted,
// and any paging fault (a duplicate, an order break, a lease not matching
// the filter).
func (w *r7World) list(f lease.ListRequest, size int) string {
	f.PageSize, f.DeadlineAt = size, r7Far
	var got []string
	var faults []string
	seen := map[string]bool{}
	last := ""
	pages := 0
	for {
		res, err := w.s.List(context.Background(), f)
		if err != nil {
			return "err " + string(lease.CodeOf(err))
		}
		pages++
		for _, r := range res.Leases {
			if seen[r.LeaseID] {
				faults = append(faults, "dup "+w.label(r.LeaseID))
			}
			if r.LeaseID <= last {
				faults = append(faults, "order "+w.label(r.LeaseID))
			}
			last = r.LeaseID
			seen[r.LeaseID] = true
			match := true
			switch f.By {
			case lease.ListByOwner:
				match = r.OwnerPrincipalID == f.OwnerPrincipalID
			case lease.ListByProgram:
				match = r.TenantID == f.TenantID && r.ProgramID == f.ProgramID
			case lease.ListByTarget:
				match = r.TenantID == f.TenantID && r.ProgramID == f.ProgramID && r.TargetNamespace == f.TargetNamespace && r.TargetID == f.TargetID
			}
			if !match || r.State != lease.StateActive {
				faults = append(faults, "foreign "+w.label(r.LeaseID))
			}
			got = append(got, w.label(r.LeaseID))
		}
		if res.NextPageToken == "" || pages > 500 {
			break
		}
		f.PageToken = res.NextPageToken
	}
	sort.Strings(got)
	return fmt.Sprintf("%v faults=%v", got, faults)
}

// r7Observe is the phase both builds run on a copy of the schema 6 file:
// every read, then replays, conflicts and new mutations, then the reaper
// over time.
func r7Observe(t *testing.T, s *Store, c *clock) []string {
	ctx := context.Background()
	w := newR7World(t, s, c)
	w.reads("migrated")
	ids := r7Identities(t)
	targets := r7Targets(t)
	// Replays and changed retries of the build's requests.
	for i := range targets {
		id, owner := ids[i], r7Owners[i%2]
		r, err := s.Acquire(ctx, r7Acq(id, owner, fmt.Sprintf("b-acq-%d-1", i), time.Hour))
		w.res(fmt.Sprintf("replay b-acq-%d-1", i), r, err)
		r, err = s.Acquire(ctx, r7Acq(id, owner, fmt.Sprintf("b-acq-%d-1", i), 3*time.Hour))
		w.res(fmt.Sprintf("changed b-acq-%d-1", i), r, err)
	}
	// Commits: replays of accepted ones, a stale token, a new one.
	var liveLabels []string
	for l, r := range w.recs {
		if r.State == lease.StateActive && r.ExpiresAt.UnixMilli() > c.Now().UnixMilli() {
			liveLabels = append(liveLabels, l)
		}
	}
	sort.Strings(liveLabels)
	for _, l := range liveLabels {
		r := w.recs[l]
		for i := range targets {
			w.commit(r, r.FencingToken, fmt.Sprintf("b-com-%d-2", i), true)
		}
		w.commit(r, r.FencingToken, "o-com-"+l, false)
		w.commit(r, r.FencingToken, "o-com-"+l, false)
		w.commit(r, r.FencingToken-1, "o-com-stale-"+l, false)
	}
	// New acquisitions everywhere: conflicts for live leases, corrupt for
	// the quarantined identity, the next token elsewhere.
	for i, id := range ids {
		owner := r7Owners[i%2]
		if i >= len(targets)+2 {
			owner = "prn-r7-c"
		}
		w.acquire(id, owner, fmt.Sprintf("o-acq-%d", i), time.Hour)
	}
	w.note("quarantine: %v", r7Quarantine(t, s))
	w.note("marks: %v", r7HighWater(t, s))
	// Renew and release what is held now, in label order.
	var held []string
	for l, r := range w.recs {
		if r.State == lease.StateActive {
			held = append(held, l)
		}
	}
	sort.Strings(held)
	for n, l := range held {
		r := w.recs[l]
		if r.ExpiresAt.UnixMilli() <= c.Now().UnixMilli() {
			continue
		}
		if n%2 == 0 {
			w.renew(r, "o-ren-"+l, 3*time.Hour)
		} else {
			w.release(r, "o-rel-"+l)
		}
	}
	w.reads("mutated")
	// The reaper: expiry, then evidence, then history past retention.
	for _, d := range []time.Duration{4 * time.Hour, 25 * time.Hour, lease.DefaultIdempotencyRetention, lease.DefaultHistoryRetention} {
		c.Add(d)
		if err := s.reap(ctx); err != nil {
			t.Fatal(err)
		}
		w.note("reaped +%s: active %d", d, r7Count(t, s))
		w.reads("reaped+" + d.String())
	}
	for i, id := range ids {
		w.acquire(id, r7Owners[0], fmt.Sprintf("o-final-%d", i), time.Hour)
	}
	return w.out
}

func r7Count(t *testing.T, s *Store) int {
	n, err := s.ActiveLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// r7Recover restores backup into dir, reads the closed namespace, raises
// every counter by 5, ends the restored leases, reopens, and acquires
// every identity again.
func r7Recover(t *testing.T, backup []byte, dir string) []string {
	ctx := context.Background()
	c := &clock{t: r7ObserveAt}
	o := r7Opts(c)
	path := filepath.Join(dir, "restored.db")
	w := newR7World(t, nil, c)
	if _, err := NewNamespace(path, o).Restore(ctx, bytes.NewReader(backup)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	cl, err := NewNamespace(path, o).OpenClosed(ctx)
	if err != nil {
		t.Fatalf("open closed: %v", err)
	}
	st, err := cl.State(ctx)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	var keys []string
	for k := range st.Counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	plan := lease.RecoveryPlan{Counters: map[string]uint64{}, Reason: "review7 recovery"}
	for _, k := range keys {
		w.note("counter %s=%d", k, st.Counters[k])
		plan.Counters[k] = st.Counters[k] + 5
	}
	keys = keys[:0]
	for k := range st.HighWater {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w.note("high water %s=%d", k, st.HighWater[k])
	}
	var act []string
	// In lock key text order, so labels do not depend on the file's key order.
	sort.Slice(st.Active, func(i, j int) bool { return st.Active[i].LockKey < st.Active[j].LockKey })
	for _, r := range st.Active {
		act = append(act, r.LockKey+" "+w.rec(r))
	}
	sort.Strings(act)
	w.note("active: %v", act)
	res, err := cl.Finish(ctx, plan)
	if err != nil {
		t.Fatalf("finish: %v", err)
	}
	var rv, ex []string
	for _, id := range res.Revoked {
		rv = append(rv, w.label(id))
	}
	for _, id := range res.Expired {
		ex = append(ex, w.label(id))
	}
	sort.Strings(rv)
	sort.Strings(ex)
	w.note("finish: raised %d revoked %v expired %v", res.Raised, rv, ex)
	s, err := Open(path, o)
	if err != nil {
		t.Fatalf("open recovered: %v", err)
	}
	defer s.Close()
	w.s = s
	for i, id := range r7Identities(t) {
		w.acquire(id, r7Owners[0], fmt.Sprintf("r-acq-%d", i), time.Hour)
	}
	w.reads("recovered")
	return w.out
}
