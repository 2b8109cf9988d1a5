package etcd

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/service"
)

var auditT0 = time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)

func auditEvent(t audit.EventType, at time.Time) audit.Event {
	e := audit.NewEvent(t, at)
	e.LatencyMS = 3
	e.RequestID, e.CorrelationID, e.TraceID = "request_01", "corr_01", "trace_01"
	e.ExecutionID, e.JobID = "execution_01", "job_01"
	e.SetCaller(lease.Caller{PrincipalID: "prn_actor_01", PrincipalClass: audit.PrincipalActorComponent,
		ClientID: "client_01", CredentialID: "key_01"})
	e.ServiceInstanceID = "instance_01"
	e.SetScope(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target_01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"})
	e.LeaseID = "lease_01"
	e.SetFencingToken(42)
	e.RequestedTTLMS, e.EffectiveTTLMS = 30000, 30000
	e.DeadlineClass = audit.DeadlineClient
	e.ResultingState = lease.StateActive
	e.SetResult(lease.CodeAcquired)
	e.BackendHealth = lease.HealthOK
	if t == audit.EventRevoke {
		e.PrincipalClass, e.PrincipalID = audit.PrincipalAdministrator, "prn_admin_01"
		e.PreviousState, e.ResultingState = lease.StateActive, lease.StateRevoked
		e.SetResult(lease.CodeRevoked)
		e.RequestedTTLMS, e.EffectiveTTLMS = 0, 0
		e.Reason, e.IncidentID = "compromised worker host", "inc-2026-0042"
	}
	return e
}

func auditEventIDs(es []audit.Event) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return out
}

func auditSameIDs(t *testing.T, what string, got, want []audit.Event) {
	t.Helper()
	g, w := auditEventIDs(got), auditEventIDs(want)
	if strings.Join(g, ",") != strings.Join(w, ",") {
		t.Fatalf("%s:\n got  %v\n want %v", what, g, w)
	}
}

// auditStream is what the stream's keys hold, read directly: the entries
// in key order (pos and value), the markers and the decoded head.
type auditStream struct {
	pos     []string
	values  []string
	markers map[string]string
	head    auditHead
	hasHead bool
}

func readAuditStream(t *testing.T, cli *clientv3.Client, s *Store) auditStream {
	t.Helper()
	var st auditStream
	r, err := cli.Get(t.Context(), s.keys.auditEntries(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		st.pos = append(st.pos, string(kv.Key[len(s.keys.auditEntries()):]))
		st.values = append(st.values, string(kv.Value))
	}
	r, err = cli.Get(t.Context(), s.keys.auditMarker(""), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	st.markers = map[string]string{}
	for _, kv := range r.Kvs {
		st.markers[string(kv.Key[len(s.keys.auditMarker("")):])] = string(kv.Value)
	}
	r, err = cli.Get(t.Context(), s.keys.auditHead())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 1 {
		var ok bool
		if st.head, ok = decodeAuditHead(r.Kvs[0].Value); !ok {
			t.Fatalf("head %x does not decode", r.Kvs[0].Value)
		}
		st.hasHead = true
	}
	return st
}

// check asserts the stream's invariants: entries in sequence order with
// non-decreasing ms never before their event's time, the head naming the
// last of them and counting them, and one marker per event, naming its
// newest entry.
func (st auditStream) check(t *testing.T) {
	t.Helper()
	var lastSeq, lastMs uint64
	newest := map[string]string{}
	for i, pos := range st.pos {
		ms, id, ok := parseAuditPos(pos)
		if !ok {
			t.Fatalf("entry %d: malformed pos %q", i, pos)
		}
		var seq uint64
		fmt.Sscanf(strings.Split(pos, "/")[1], "%x", &seq)
		if seq <= lastSeq || ms < lastMs || ms < auditEventMs(id) {
			t.Fatalf("entry %s out of order (after seq %d, ms %d) or before its event's time", pos, lastSeq, lastMs)
		}
		lastSeq, lastMs = seq, ms
		newest[id] = pos
	}
	if len(st.pos) > 0 && (st.head.seq != lastSeq || st.head.ms != lastMs || st.head.count != uint64(len(st.pos))) {
		t.Fatalf("head %+v, entries end at seq %d ms %d, %d of them", st.head, lastSeq, lastMs, len(st.pos))
	}
	if len(st.markers) != len(newest) {
		t.Fatalf("%d markers for %d events", len(st.markers), len(newest))
	}
	for id, pos := range newest {
		if st.markers[id] != pos {
			t.Fatalf("marker of %s names %q, want its newest entry %q", id, st.markers[id], pos)
		}
	}
}

// TestAuditSink runs the sink on one three-member cluster with
// authentication on, as the least-privilege user, every subtest in a fresh
// prefix.
func TestAuditSink(t *testing.T) {
	a := startPrivilegeCluster(t)

	// Round trip and filters: what Read returns is byte for byte what was
	// written, in order, and each filter selects what bolt.AuditSink's
	// would.
	t.Run("RoundTripAndFilter", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		defer sink.Close()
		var all []audit.Event
		for i := range 30 {
			at := auditT0.Add(time.Duration(i) * time.Second)
			var e audit.Event
			switch i % 3 {
			case 0:
				e = auditEvent(audit.EventAcquire, at)
			case 1:
				e = auditEvent(audit.EventAcquire, at)
				e.LeaseID, e.FencingToken, e.ResultingState = "", nil, ""
				e.SetResult(lease.CodeConflict)
				e.ProgramID = "program-b"
			case 2:
				e = auditEvent(audit.EventRevoke, at)
				e.LeaseID, e.TenantID = "lease_other", "tenant-two"
			}
			if err := sink.Write(t.Context(), e); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			all = append(all, e)
		}
		before := readAuditStream(t, a.root, s)
		bad := auditEvent(audit.EventAcquire, auditT0)
		bad.TenantID = "Bad Tenant"
		if err := sink.Write(t.Context(), bad); err == nil {
			t.Fatal("invalid event stored")
		}
		if after := readAuditStream(t, a.root, s); after.head != before.head || len(after.pos) != len(before.pos) {
			t.Fatal("the refused event changed the stream")
		}

		got, err := sink.Read(t.Context(), audit.Filter{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "read all", got, all)
		for i := range got {
			a, _ := audit.Marshal(got[i])
			b, _ := audit.Marshal(all[i])
			if string(a) != string(b) {
				t.Fatalf("event %d changed:\n%s\n%s", i, a, b)
			}
		}
		// The entries hold exactly the encoded events, at their events'
		// times, in sequence.
		st := readAuditStream(t, a.root, s)
		st.check(t)
		if len(st.pos) != len(all) {
			t.Fatalf("%d entries, want %d", len(st.pos), len(all))
		}
		for i, e := range all {
			want, _ := audit.Marshal(e)
			if st.values[i] != string(want) || st.pos[i] != auditPos(uint64(e.Timestamp.UnixMilli()), uint64(i+1), e.EventID) {
				t.Fatalf("entry %d: %s = %s, want the event at its time", i, st.pos[i], st.values[i])
			}
		}

		pick := func(f func(i int) bool) (out []audit.Event) {
			for i, e := range all {
				if f(i) {
					out = append(out, e)
				}
			}
			return out
		}
		for _, c := range []struct {
			name  string
			f     audit.Filter
			limit int
			want  []audit.Event
		}{
			{"type", audit.Filter{EventType: audit.EventRevoke}, 0, pick(func(i int) bool { return i%3 == 2 })},
			{"tenant", audit.Filter{TenantID: "tenant-main"}, 0, pick(func(i int) bool { return i%3 != 2 })},
			{"program", audit.Filter{ProgramID: "program-b"}, 0, pick(func(i int) bool { return i%3 == 1 })},
			{"lease", audit.Filter{LeaseID: "lease_01"}, 0, pick(func(i int) bool { return i%3 == 0 })},
			{"since", audit.Filter{Since: auditT0.Add(20 * time.Second)}, 0, all[20:]},
			{"since and type", audit.Filter{Since: auditT0.Add(20 * time.Second), EventType: audit.EventAcquire},
				0, pick(func(i int) bool { return i >= 20 && i%3 != 2 })},
			{"limit", audit.Filter{}, 5, all[:5]},
			{"after", audit.Filter{After: all[9].EventID}, 5, all[10:15]},
			{"after and since", audit.Filter{After: all[25].EventID, Since: auditT0.Add(20 * time.Second)}, 0, all[26:]},
			{"after and type", audit.Filter{After: all[2].EventID, EventType: audit.EventRevoke}, 2, []audit.Event{all[5], all[8]}},
			{"after the last", audit.Filter{After: all[29].EventID}, 0, nil},
			{"nothing", audit.Filter{TenantID: "nobody"}, 0, nil},
		} {
			got, err := sink.Read(t.Context(), c.f, c.limit)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			auditSameIDs(t, c.name, got, c.want)
		}
		// Paging with After visits every event once.
		var paged []audit.Event
		for f, n := (audit.Filter{}), 0; ; n++ {
			if n > len(all) {
				t.Fatal("paging does not end")
			}
			page, err := sink.Read(t.Context(), f, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			f.After = page[len(page)-1].EventID
		}
		auditSameIDs(t, "paged", paged, all)
		if _, err := sink.Read(t.Context(), audit.Filter{After: "not-an-id"}, 0); err == nil {
			t.Fatal("a malformed After was accepted")
		}
	})

	// Several writers append out of event-time order: no write is refused,
	// an entry's ms is never before its event's time, and paging by After
	// (a position) returns every event exactly once, a late one included.
	t.Run("OutOfOrder", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		late := auditEvent(audit.EventAcquire, auditT0.Add(10*time.Second))
		early := auditEvent(audit.EventAcquire, auditT0.Add(5*time.Second))
		sameMs := auditEvent(audit.EventAcquire, auditT0.Add(10*time.Second))
		first := auditEvent(audit.EventAcquire, auditT0)
		order := []audit.Event{first, late, early, sameMs}
		for _, e := range order {
			if err := sink.Write(t.Context(), e); err != nil {
				t.Fatal(err)
			}
		}
		st := readAuditStream(t, a.root, s)
		st.check(t)
		if len(st.pos) != len(order) {
			t.Fatalf("%d entries", len(st.pos))
		}
		// The late-written early event takes the newest entry's time, not
		// a clock's.
		if want := hex16(uint64(auditT0.Add(10*time.Second).UnixMilli())) + "/"; !strings.HasPrefix(st.pos[2], want) {
			t.Fatalf("late-written entry %s, want %s*", st.pos[2], want)
		}
		got, err := sink.Read(t.Context(), audit.Filter{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "arrival order", got, order)
		var paged []audit.Event
		for f, n := (audit.Filter{}), 0; ; n++ {
			if n > len(order) {
				t.Fatalf("paging does not end: %v", auditEventIDs(paged))
			}
			page, err := sink.Read(t.Context(), f, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			f.After = page[0].EventID
		}
		auditSameIDs(t, "paged one by one", paged, order)
		// Since is by event time: the late-written early event is found.
		got, err = sink.Read(t.Context(), audit.Filter{Since: auditT0.Add(5 * time.Second)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "since", got, []audit.Event{late, early, sameMs})
	})

	// The stream is capped exactly: old events go with their markers, the
	// newest stay, Read still works; a lowered cap is reached gradually.
	t.Run("Cap", func(t *testing.T) {
		s := a.open(t, Options{})
		const maxLen = 50
		sink := s.AuditSink(AuditOptions{MaxLen: maxLen})
		var all []audit.Event
		for i := range 130 {
			e := auditEvent(audit.EventAcquire, auditT0.Add(time.Duration(i)*time.Millisecond))
			if err := sink.Write(t.Context(), e); err != nil {
				t.Fatal(err)
			}
			all = append(all, e)
		}
		st := readAuditStream(t, a.root, s)
		st.check(t)
		if len(st.pos) != maxLen || st.head.seq != 130 {
			t.Fatalf("stream holds %d events (head %+v), want %d", len(st.pos), st.head, maxLen)
		}
		got, err := sink.Read(t.Context(), audit.Filter{}, audit.MaxReadLimit)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "the newest events", got, all[len(all)-maxLen:])
		// A page token pointing at a removed event still reads on.
		got, err = sink.Read(t.Context(), audit.Filter{After: all[0].EventID}, 0)
		if err != nil || len(got) != maxLen || got[0].EventID != all[len(all)-maxLen].EventID {
			t.Fatalf("after a removed event: %v %d", err, len(got))
		}
		// A removed event has no marker: WriteOnce adds it again.
		if err := sink.WriteOnce(t.Context(), all[0]); err != nil {
			t.Fatal(err)
		}
		if got, err := sink.Read(t.Context(), audit.Filter{After: all[len(all)-1].EventID}, 0); err != nil || len(got) != 1 || got[0].EventID != all[0].EventID {
			t.Fatalf("WriteOnce of a removed event: %v %v", err, auditEventIDs(got))
		}
		// Lowered to 20: each append removes its own excess and
		// auditTrimExtra more.
		small := s.AuditSink(AuditOptions{MaxLen: 20})
		for i := 0; ; i++ {
			if i > 10 {
				t.Fatal("the lowered cap is not reached")
			}
			if err := small.Write(t.Context(), auditEvent(audit.EventAcquire, auditT0.Add(time.Second))); err != nil {
				t.Fatal(err)
			}
			st := readAuditStream(t, a.root, s)
			st.check(t)
			if want := max(20, maxLen-(i+1)*auditTrimExtra); len(st.pos) != want {
				t.Fatalf("after %d appends with the cap lowered: %d entries, want %d", i+1, len(st.pos), want)
			}
			if len(st.pos) == 20 {
				break
			}
		}
		if def := s.AuditSink(AuditOptions{}); def.maxLen != DefaultAuditMaxLen {
			t.Fatalf("default cap %d", def.maxLen)
		}
	})

	// Corrupt entries fail the read; a head that does not decode fails the
	// write, which then writes nothing.
	t.Run("Corrupt", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		first := auditEvent(audit.EventAcquire, auditT0)
		if err := sink.Write(t.Context(), first); err != nil {
			t.Fatal(err)
		}
		second := auditEvent(audit.EventAcquire, auditT0.Add(time.Second))
		good, _ := audit.Marshal(second)
		dup := strings.Replace(string(good), `"latency_ms":3`, `"latency_ms":3,"latency_ms":4`, 1)
		pos := auditPos(uint64(auditT0.Add(time.Second).UnixMilli()), 2, second.EventID)
		for name, kv := range map[string][2]string{
			"duplicate field": {pos, dup},
			"not json":        {pos, "{"},
			"empty":           {pos, ""},
			"another event":   {auditPos(uint64(auditT0.Add(time.Second).UnixMilli()), 2, first.EventID), string(good)},
			"malformed key":   {hex16(uint64(auditT0.Add(time.Second).UnixMilli())) + "/x", string(good)},
		} {
			k := s.keys.auditEntries() + kv[0]
			a.put(t, k, kv[1])
			if _, err := sink.Read(t.Context(), audit.Filter{}, 0); err == nil {
				t.Fatalf("%s: read of a corrupt entry succeeded", name)
			}
			if _, err := a.root.Delete(t.Context(), k); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := sink.Read(t.Context(), audit.Filter{}, 0); err != nil || len(got) != 1 {
			t.Fatalf("read after the corrupt entries went: %v %d", err, len(got))
		}
		// A marker that names no valid pos fails a read after its event.
		a.put(t, s.keys.auditMarker(first.EventID), "junk")
		if _, err := sink.Read(t.Context(), audit.Filter{After: first.EventID}, 0); err == nil {
			t.Fatal("a read after a corrupt marker succeeded")
		}
		for _, head := range []string{"x", string(make([]byte, 23)), string(make([]byte, 25))} {
			a.put(t, s.keys.auditHead(), head)
			before := a.snapshot(t, s)
			if err := sink.Write(t.Context(), second); err == nil || !strings.Contains(err.Error(), "malformed") {
				t.Fatalf("write over a head of %d bytes: %v", len(head), err)
			}
			if after := a.snapshot(t, s); !maps.Equal(before, after) {
				t.Fatal("the refused write changed the prefix")
			}
		}
	})

	// WriteOnce adds an event at most once: not again after an earlier
	// WriteOnce or Write (the marker every add sets), also within one
	// group of concurrent writes.
	t.Run("WriteOnce", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		now := time.Now()
		e1, e2, e3 := auditEvent(audit.EventAcquire, now), auditEvent(audit.EventAcquire, now.Add(time.Millisecond)),
			auditEvent(audit.EventRevoke, now.Add(2*time.Millisecond))
		if err := sink.Write(t.Context(), e1); err != nil {
			t.Fatal(err)
		}
		for _, e := range []audit.Event{e1, e2, e2, e3, e1, e3} {
			if err := sink.WriteOnce(t.Context(), e); err != nil {
				t.Fatal(err)
			}
		}
		got, err := sink.Read(t.Context(), audit.Filter{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "stream after repeated WriteOnce", got, []audit.Event{e1, e2, e3})
		e4 := auditEvent(audit.EventAcquire, now.Add(3*time.Millisecond))
		var wg sync.WaitGroup
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sink.WriteOnce(t.Context(), e4); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		got, err = sink.Read(t.Context(), audit.Filter{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		auditSameIDs(t, "stream after concurrent WriteOnce", got, []audit.Event{e1, e2, e3, e4})
		// A plain Write does add a second copy; its marker moves to it.
		if err := sink.Write(t.Context(), e2); err != nil {
			t.Fatal(err)
		}
		st := readAuditStream(t, a.root, s)
		st.check(t)
		if len(st.pos) != 5 {
			t.Fatalf("%d entries after a second Write, want 5", len(st.pos))
		}
	})

	// WriteOnce's dedupe depends on no clock: after another server whose
	// clock runs ahead has added an entry (so later entries are filed at
	// its time), a Write whose reply was lost and whose event the Spool
	// then forwards with WriteOnce is in the stream once.
	t.Run("WriteOnceAfterLostReplyDespiteClockSkew", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		now := time.Now()
		skewed := auditEvent(audit.EventAcquire, now.Add(2*time.Minute))
		if err := sink.Write(t.Context(), skewed); err != nil {
			t.Fatal(err)
		}
		e := auditEvent(audit.EventRevoke, now)
		if err := sink.Write(t.Context(), e); err != nil {
			t.Fatal(err)
		}
		if err := sink.WriteOnce(t.Context(), e); err != nil {
			t.Fatal(err)
		}
		got, err := sink.Read(t.Context(), audit.Filter{EventType: audit.EventRevoke}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Fatalf("the revoke event is in the stream %d times", len(got))
		}
	})

	// Two servers (two stores, two clients) with many writers each share
	// one stream: every event is in it exactly once, in one sequence, and
	// each server's writes go in groups.
	t.Run("ConcurrentServers", func(t *testing.T) {
		o := a.options(t, Options{})
		sinks := []*AuditSink{open(t, a.c, o).AuditSink(AuditOptions{}), open(t, a.c, o).AuditSink(AuditOptions{})}
		const writers, each = 8, 20
		var mu sync.Mutex
		written := map[string]bool{}
		rev := func() int64 {
			r, err := a.root.Get(t.Context(), "x")
			if err != nil {
				t.Fatal(err)
			}
			return r.Header.Revision
		}
		start := rev()
		var wg sync.WaitGroup
		for i := range 2 * writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range each {
					e := auditEvent(audit.EventAcquire, time.Now())
					e.CorrelationID = fmt.Sprintf("w%d-%d", i, j)
					if err := sinks[i%2].Write(t.Context(), e); err != nil {
						t.Errorf("writer %d: %v", i, err)
						return
					}
					mu.Lock()
					written[e.EventID] = true
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		// Every transaction is one revision: fewer than the events means
		// events went in groups.
		if txns := rev() - start; txns >= 2*writers*each {
			t.Fatalf("%d events took %d transactions", 2*writers*each, txns)
		} else {
			t.Logf("%d events in %d transactions", 2*writers*each, txns)
		}
		st := readAuditStream(t, a.root, sinks[0].s)
		st.check(t)
		if len(st.pos) != 2*writers*each || st.head.seq != uint64(len(st.pos)) {
			t.Fatalf("%d entries, head %+v; want %d", len(st.pos), st.head, 2*writers*each)
		}
		for _, pos := range st.pos {
			_, id, _ := parseAuditPos(pos)
			if !written[id] {
				t.Fatalf("entry %s was not written by a writer", pos)
			}
			delete(written, id)
		}
		if len(written) != 0 {
			t.Fatalf("%d events missing", len(written))
		}
		// Each writer's events are in the order it wrote them.
		got, err := sinks[1].Read(t.Context(), audit.Filter{}, audit.MaxReadLimit)
		if err != nil {
			t.Fatal(err)
		}
		next := map[string]int{}
		for _, e := range got {
			w, n, _ := strings.Cut(e.CorrelationID, "-")
			if want := fmt.Sprint(next[w]); n != want {
				t.Fatalf("writer %s: event %s after %d", w, n, next[w])
			}
			next[w]++
		}
	})

	t.Run("Closed", func(t *testing.T) {
		s := a.open(t, Options{})
		sink := s.AuditSink(AuditOptions{})
		if err := sink.Write(t.Context(), auditEvent(audit.EventAcquire, time.Now())); err != nil {
			t.Fatal(err)
		}
		sink.Close()
		if err := sink.Write(t.Context(), auditEvent(audit.EventAcquire, time.Now())); !errors.Is(err, audit.ErrClosed) {
			t.Fatalf("write after close: %v", err)
		}
		if _, err := sink.Read(t.Context(), audit.Filter{}, 0); !errors.Is(err, audit.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
		other := s.AuditSink(AuditOptions{})
		s.Close()
		if err := other.Write(t.Context(), auditEvent(audit.EventAcquire, time.Now())); err == nil {
			t.Fatal("write after the store closed succeeded")
		}
	})
}

// TestAuditSinkQuorumLoss: writes fail while the cluster has no quorum,
// without an endpoint in the error; a revoke behind the sink is then
// refused and its lease left alone; what was acknowledged before is there
// afterwards. Through a Spool, nothing is lost: the events spooled during
// the outage reach the stream when quorum is back, in order, once each.
func TestAuditSinkQuorumLoss(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	// Long enough for a loaded machine with quorum, short enough that the
	// calls refused during the outage keep the test short.
	s := open(t, c, Options{OpTimeout: 3 * time.Second})
	sink := s.AuditSink(AuditOptions{})

	store, err := bolt.Open(filepath.Join(t.TempDir(), "starlease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	svc, err := service.New(store, sink, service.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	principal := func(id string, class auth.Class, caps ...auth.Capability) auth.Principal {
		return auth.Principal{ID: id, Class: class, ClientID: id, CredentialID: "01M8VRFBG00000000000000000",
			Capabilities: caps, Scope: credScope(t)}
	}
	holder := principal("prn-holder", auth.ClassAPIClient, auth.CapLease)
	admin := principal("prn-admin", auth.ClassAdministrator, auth.CapForceRelease, auth.CapRead)
	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "web", TargetID: "example.com", ActorName: "crawler"}
	got, err := svc.Acquire(t.Context(), service.Call{Principal: holder, CorrelationID: "corr-1", RequestID: "req-1"},
		service.AcquireInput{Identity: id, TTL: 30 * time.Second, ServiceInstanceID: "inst-1", ExecutionID: "exec-1", JobID: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := sink.Read(t.Context(), audit.Filter{EventType: audit.EventAcquire}, 0); err != nil || len(evs) != 1 ||
		evs[0].LeaseID != got.Lease.LeaseID {
		t.Fatalf("acquire audit: %v %v", err, evs)
	}

	sp, err := audit.OpenSpool(filepath.Join(t.TempDir(), "audit-spool.jsonl"), s.AuditSink(AuditOptions{}),
		audit.SpoolOptions{RetryInterval: 50 * time.Millisecond, ForwardTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	at := time.Now()
	var spooled []audit.Event
	write := func(n int) {
		t.Helper()
		for range n {
			at = at.Add(time.Millisecond)
			e := auditEvent(audit.EventAcquire, at)
			if err := sp.Write(t.Context(), e); err != nil {
				t.Fatalf("spool write: %v", err)
			}
			spooled = append(spooled, e)
		}
	}
	write(2)
	if sp.Pending() != 0 {
		t.Fatalf("pending %d with the cluster up", sp.Pending())
	}

	leader := c.Leader()
	other := (leader + 1) % 3
	c.Member(leader).Kill()
	c.Member(other).Kill()
	err = sink.Write(t.Context(), auditEvent(audit.EventAcquire, time.Now()))
	if err == nil {
		t.Fatal("write with quorum lost succeeded")
	}
	if strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("error leaks the address: %v", err)
	}
	_, err = svc.Revoke(t.Context(), service.Call{Principal: admin, CorrelationID: "corr-2", RequestID: "req-2"},
		service.AdminInput{Identity: id, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "compromised"})
	if lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("revoke without audit: %v, want backend_unavailable", err)
	}
	in, err := store.Inspect(t.Context(), lease.InspectRequest{Identity: id, DeadlineAt: time.Now().Add(10 * time.Second)})
	if err != nil || in.Lease.State != lease.StateActive || in.Lease.LeaseID != got.Lease.LeaseID {
		t.Fatalf("lease after a refused revoke: %v %+v", err, in.Lease)
	}
	write(4)
	if sp.Pending() != 4 {
		t.Fatalf("pending %d with quorum lost, want 4", sp.Pending())
	}

	c.Member(leader).Restart()
	c.Member(other).Restart()
	c.WaitLeader(15 * time.Second)
	write(1) // joins the waiting events
	for limit := time.Now().Add(30 * time.Second); sp.Pending() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatalf("%d events still spooled 30 s after quorum came back", sp.Pending())
		}
	}
	if err := sp.Check(t.Context()); err != nil {
		t.Fatalf("Check after draining: %v", err)
	}
	all, err := sink.Read(t.Context(), audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	// The acknowledged acquire event survived; the writes that failed
	// during the outage may have committed once quorum returned (in
	// doubt); the spooled events are there once each, in order.
	if all[0].LeaseID != got.Lease.LeaseID || all[0].EventType != audit.EventAcquire {
		t.Fatalf("the acknowledged event is gone: %+v", all[0])
	}
	var fromSpool []audit.Event
	want := map[string]bool{}
	for _, e := range spooled {
		want[e.EventID] = true
	}
	for _, e := range all {
		if want[e.EventID] {
			fromSpool = append(fromSpool, e)
		}
	}
	auditSameIDs(t, "spooled events in the stream", fromSpool, spooled)
	st := readAuditStream(t, c.Client(), s)
	st.check(t)
}
