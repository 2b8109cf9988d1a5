package valkey

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
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

func eventIDs(es []audit.Event) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return out
}

func sameIDs(t *testing.T, what string, got, want []audit.Event) {
	t.Helper()
	g, w := eventIDs(got), eventIDs(want)
	if strings.Join(g, ",") != strings.Join(w, ",") {
		t.Fatalf("%s:\n got  %v\n want %v", what, g, w)
	}
}

// Round trip and filters, as the documented ACL user: what Read returns is
// byte for byte what was written, in order, and each filter selects what
// bolt.AuditSink's would.
func TestAuditSinkRoundTripAndFilter(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
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
		if err := sink.Write(bg, e); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		all = append(all, e)
	}
	bad := auditEvent(audit.EventAcquire, auditT0)
	bad.TenantID = "Bad Tenant"
	if err := sink.Write(bg, bad); err == nil {
		t.Fatal("invalid event stored")
	}

	got, err := sink.Read(bg, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "read all", got, all)
	for i := range got {
		a, _ := audit.Marshal(got[i])
		b, _ := audit.Marshal(all[i])
		if string(a) != string(b) {
			t.Fatalf("event %d changed:\n%s\n%s", i, a, b)
		}
	}
	// The stream holds exactly the encoded event in one field.
	entries, err := s.client.Do(bg, s.client.B().Xrange().Key(s.keys.audit()).Start("-").End("+").Count(1).Build()).AsXRange()
	if err != nil || len(entries) != 1 {
		t.Fatalf("xrange: %v", err)
	}
	want, _ := audit.Marshal(all[0])
	if len(entries[0].FieldValues) != 1 || entries[0].FieldValues["e"] != string(want) {
		t.Fatalf("stream entry %v, want one field e = %s", entries[0].FieldValues, want)
	}
	if entries[0].ID != fmt.Sprintf("%d-0", auditT0.UnixMilli()) {
		t.Fatalf("entry id %s, want the event's time", entries[0].ID)
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
		got, err := sink.Read(bg, c.f, c.limit)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sameIDs(t, c.name, got, c.want)
	}
	// Paging with After visits every event once.
	var paged []audit.Event
	for f, n := (audit.Filter{}), 0; ; n++ {
		if n > len(all) {
			t.Fatal("paging does not end")
		}
		page, err := sink.Read(bg, f, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		f.After = page[len(page)-1].EventID
	}
	sameIDs(t, "paged", paged, all)
	if _, err := sink.Read(bg, audit.Filter{After: "not-an-id"}, 0); err == nil {
		t.Fatal("a malformed After was accepted")
	}
}

// Several writers append out of event-time order: no write is refused, an
// entry's id time is never before its event's time, and paging by After
// (a position) returns every event exactly once, a late one included.
func TestAuditSinkOutOfOrder(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
	sink := s.AuditSink(AuditOptions{})
	late := auditEvent(audit.EventAcquire, auditT0.Add(10*time.Second))
	early := auditEvent(audit.EventAcquire, auditT0.Add(5*time.Second))
	sameMs := auditEvent(audit.EventAcquire, auditT0.Add(10*time.Second))
	first := auditEvent(audit.EventAcquire, auditT0)
	order := []audit.Event{first, late, early, sameMs}
	for _, e := range order {
		if err := sink.Write(bg, e); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := s.client.Do(bg, s.client.B().Xrange().Key(s.keys.audit()).Start("-").End("+").Build()).AsXRange()
	if err != nil || len(entries) != len(order) {
		t.Fatalf("xrange: %v %d", err, len(entries))
	}
	for i, en := range entries {
		if streamMs(en.ID) < eventMs(order[i].EventID) {
			t.Fatalf("entry %s is before its event's time", en.ID)
		}
	}
	// The late-written early event takes the newest entry's time, not the
	// server's clock, so a page token finds it near its own time.
	if want := fmt.Sprintf("%d-", auditT0.Add(10*time.Second).UnixMilli()); !strings.HasPrefix(entries[2].ID, want) {
		t.Fatalf("late-written entry id %s, want %s*", entries[2].ID, want)
	}
	got, err := sink.Read(bg, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "arrival order", got, order)
	var paged []audit.Event
	for f, n := (audit.Filter{}), 0; ; n++ {
		if n > len(order) {
			t.Fatalf("paging does not end: %v", eventIDs(paged))
		}
		page, err := sink.Read(bg, f, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		f.After = page[0].EventID
	}
	sameIDs(t, "paged one by one", paged, order)
	// Since is by event time: the late-written early event is found.
	got, err = sink.Read(bg, audit.Filter{Since: auditT0.Add(5 * time.Second)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "since", got, []audit.Event{late, early, sameMs})
}

// The stream is capped: old events go, the newest stay, Read still works.
func TestAuditSinkCap(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	const maxLen = 50
	sink := s.AuditSink(AuditOptions{MaxLen: maxLen})
	var all []audit.Event
	for i := range 600 {
		e := auditEvent(audit.EventAcquire, auditT0.Add(time.Duration(i)*time.Millisecond))
		if err := sink.Write(bg, e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	n, err := s.client.Do(bg, s.client.B().Xlen().Key(s.keys.audit()).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ trims whole stream nodes (100 entries by default).
	if n < maxLen || n > maxLen+100 {
		t.Fatalf("stream holds %d events, want %d..%d", n, maxLen, maxLen+100)
	}
	got, err := sink.Read(bg, audit.Filter{}, audit.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "the newest events", got, all[len(all)-int(n):])
	// A page token pointing at a trimmed event still reads on.
	got, err = sink.Read(bg, audit.Filter{After: all[0].EventID}, 0)
	if err != nil || len(got) == 0 || got[0].EventID != all[len(all)-int(n)].EventID {
		t.Fatalf("after a trimmed event: %v %d", err, len(got))
	}
	if def := s.AuditSink(AuditOptions{}); def.maxLen != DefaultAuditMaxLen {
		t.Fatalf("default cap %d", def.maxLen)
	}
}

// Corrupt entries fail the read; a key of the wrong type fails the write.
func TestAuditSinkCorrupt(t *testing.T) {
	s := open(t, sharedServer(t), Options{})
	sink := s.AuditSink(AuditOptions{})
	if err := sink.Write(bg, auditEvent(audit.EventAcquire, auditT0)); err != nil {
		t.Fatal(err)
	}
	good, _ := audit.Marshal(auditEvent(audit.EventAcquire, auditT0.Add(time.Second)))
	dup := strings.Replace(string(good), `"latency_ms":3`, `"latency_ms":3,"latency_ms":4`, 1)
	for name, fv := range map[string][]string{
		"two fields":      {"e", string(good), "x", "y"},
		"other field":     {"x", string(good)},
		"duplicate field": {"e", dup},
		"not json":        {"e", "{"},
	} {
		k := s.keys.audit()
		if err := s.client.Do(bg, s.client.B().Del().Key(k).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		cmd := s.client.B().Xadd().Key(k).Id("*").FieldValue()
		for i := 0; i < len(fv); i += 2 {
			cmd = cmd.FieldValue(fv[i], fv[i+1])
		}
		if err := s.client.Do(bg, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Read(bg, audit.Filter{}, 0); err == nil {
			t.Fatalf("%s: read of a corrupt entry succeeded", name)
		}
	}
	if err := s.client.Do(bg, s.client.B().Del().Key(s.keys.audit()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(bg, s.client.B().Set().Key(s.keys.audit()).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(bg, auditEvent(audit.EventAcquire, auditT0)); err == nil {
		t.Fatal("write to a string key succeeded")
	}
	if _, err := sink.Read(bg, audit.Filter{}, 0); err == nil {
		t.Fatal("read of a string key succeeded")
	}
}

// Writes fail when the event cannot be made durable: a server that may lose
// acknowledged writes, a closed sink, a stopped server. With the sink
// behind the service, a revoke is then refused and the lease left alone.
func TestAuditSinkFailsClosed(t *testing.T) {
	nd := open(t, testenv.StartRedisWith(t, testenv.RedisConfig{AppendFsync: "everysec"}), Options{})
	if err := nd.AuditSink(AuditOptions{}).Write(bg, auditEvent(audit.EventRevoke, time.Now())); err == nil {
		t.Fatal("write on a non-durable server succeeded")
	}

	r := sharedServer(t)
	s := open(t, r, Options{})
	closed := s.AuditSink(AuditOptions{})
	closed.Close()
	if err := closed.Write(bg, auditEvent(audit.EventAcquire, time.Now())); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}

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
	got, err := svc.Acquire(bg, service.Call{Principal: holder, CorrelationID: "corr-1", RequestID: "req-1"},
		service.AcquireInput{Identity: id, TTL: 30 * time.Second, ServiceInstanceID: "inst-1", ExecutionID: "exec-1", JobID: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := sink.Read(bg, audit.Filter{EventType: audit.EventAcquire}, 0); err != nil || len(evs) != 1 {
		t.Fatalf("acquire audit: %v %d", err, len(evs))
	}

	r.Kill9()
	for i := range 4 { // a pooled connection fails once, then nothing can be sent
		err = sink.Write(bg, auditEvent(audit.EventAcquire, time.Now()))
		if err == nil {
			t.Fatalf("write %d with the server stopped succeeded", i)
		}
	}
	if strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("error leaks the address: %v", err)
	}
	_, err = svc.Revoke(bg, service.Call{Principal: admin, CorrelationID: "corr-2", RequestID: "req-2"},
		service.AdminInput{Identity: id, LeaseID: got.Lease.LeaseID, FencingToken: got.Lease.FencingToken, Reason: "compromised"})
	if lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("revoke without audit: %v, want backend_unavailable", err)
	}
	in, err := store.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()})
	if err != nil || in.Lease.State != lease.StateActive || in.Lease.LeaseID != got.Lease.LeaseID {
		t.Fatalf("lease after a refused revoke: %v %+v", err, in.Lease)
	}

	r.Restart()
	// Each connection that died with the old server fails one call (1 run
	// in 20 failed the write or the read below on one), as in the
	// credential store's restart test: the same event and the same read
	// again.
	ev := auditEvent(audit.EventAcquire, time.Now())
	err = sink.Write(bg, ev)
	for i := 0; i < 4 && err != nil; i++ {
		err = sink.Write(bg, ev)
	}
	if err != nil {
		t.Fatalf("write after restart: %v", err)
	}
	evs, err := sink.Read(bg, audit.Filter{EventType: audit.EventAcquire}, 0)
	for i := 0; i < 4 && err != nil; i++ {
		evs, err = sink.Read(bg, audit.Filter{EventType: audit.EventAcquire}, 0)
	}
	if err != nil || len(evs) != 2 {
		t.Fatalf("after restart: %v %d (the acknowledged event must survive)", err, len(evs))
	}
}

// ActiveLeases counts active records with one ZCARD, as the documented ACL
// user: acquire adds one, renew none, every ending removes one; an expired
// lease counts until it is archived.
func TestActiveLeases(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions()})
	count := func(want int64) {
		t.Helper()
		n, err := s.ActiveLeases(bg)
		if err != nil || n != want {
			t.Fatalf("ActiveLeases = %d, %v; want %d", n, err, want)
		}
	}
	count(0)
	var held []*lease.Record
	for range 3 {
		a, err := s.Acquire(bg, acquireReq(newIdentity()))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, a.Lease)
	}
	count(3)
	if _, err := s.Renew(bg, renewReq(held[0])); err != nil {
		t.Fatal(err)
	}
	count(3)
	if _, err := s.Release(bg, releaseReq(held[1])); err != nil {
		t.Fatal(err)
	}
	count(2)
	short := acquireReq(newIdentity())
	short.TTL = 100 * time.Millisecond
	if _, err := s.Acquire(bg, short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	count(3) // expired, not yet reaped
	if err := s.reap(bg); err != nil {
		t.Fatal(err)
	}
	count(2)
	if _, err := s.Revoke(bg, adminReq(held[2])); err != nil {
		t.Fatal(err)
	}
	count(1)
	s.Close()
	if _, err := s.ActiveLeases(bg); lease.CodeOf(err) != lease.CodeBackendUnavailable {
		t.Fatalf("after close: %v", err)
	}
}
