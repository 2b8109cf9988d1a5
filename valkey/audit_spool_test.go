package valkey

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
)

// WriteOnce adds an event at most once, as the documented ACL user: not
// again after an earlier WriteOnce or Write (the marker every add sets).
func TestAuditSinkWriteOnce(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
	sink := s.AuditSink(AuditOptions{})
	now := time.Now()
	e1, e2, e3 := auditEvent(audit.EventAcquire, now), auditEvent(audit.EventAcquire, now.Add(time.Millisecond)),
		auditEvent(audit.EventRevoke, now.Add(2*time.Millisecond))
	if err := sink.Write(bg, e1); err != nil {
		t.Fatal(err)
	}
	for _, e := range []audit.Event{e1, e2, e2, e3, e1, e3} {
		if err := sink.WriteOnce(bg, e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := sink.Read(bg, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "stream after repeated WriteOnce", got, []audit.Event{e1, e2, e3})
}

// Issue 11 §5 on a real server that is stopped and started again: events
// written through a Spool while Valkey is down reach the stream when it is
// back, in order, once each, after the events written before the outage.
func TestSpoolForwardsAfterValkeyRestart(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
	sp, err := audit.OpenSpool(filepath.Join(t.TempDir(), "audit-spool.jsonl"), s.AuditSink(AuditOptions{}),
		audit.SpoolOptions{RetryInterval: 50 * time.Millisecond, ForwardTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	at := time.Now()
	var want []audit.Event
	write := func(n int) {
		t.Helper()
		for range n {
			at = at.Add(time.Millisecond)
			e := auditEvent(audit.EventAcquire, at)
			if err := sp.Write(bg, e); err != nil {
				t.Fatalf("spool write: %v", err)
			}
			want = append(want, e)
		}
	}
	write(2)
	if sp.Pending() != 0 {
		t.Fatalf("pending %d with Valkey up", sp.Pending())
	}
	r.Kill9()
	write(4)
	if sp.Pending() != 4 {
		t.Fatalf("pending %d with Valkey down, want 4", sp.Pending())
	}
	r.Restart()
	write(1) // joins the waiting events
	for limit := time.Now().Add(20 * time.Second); sp.Pending() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatalf("%d events still spooled 20 s after Valkey came back", sp.Pending())
		}
	}
	// The client's connection may still be coming back: read until it
	// answers.
	var got []audit.Event
	for limit := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, err = s.AuditSink(AuditOptions{}).Read(bg, audit.Filter{}, 0); err == nil || time.Now().After(limit) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "stream after the outage", got, want)
	if err := sp.Check(bg); err != nil {
		t.Fatalf("Check after draining: %v", err)
	}
}

// TestAuditSinkWriteOnceAfterLostReplyDespiteClockSkew guarantees that
// WriteOnce's dedupe depends on no clock: after another server whose clock
// runs ahead has added an entry (so later entries are filed at its time), a
// Write whose reply was lost and whose event the Spool then forwards with
// WriteOnce is in the stream once (add sets the event's marker with the
// XADD).
func TestAuditSinkWriteOnceAfterLostReplyDespiteClockSkew(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix()})
	sink := s.AuditSink(AuditOptions{})
	now := time.Now()
	skewed := auditEvent(audit.EventAcquire, now.Add(2*time.Minute)) // a server whose clock is ahead
	if err := sink.Write(bg, skewed); err != nil {
		t.Fatal(err)
	}
	e := auditEvent(audit.EventRevoke, now)
	if err := sink.Write(bg, e); err != nil { // reached the stream; say its reply was lost
		t.Fatal(err)
	}
	if err := sink.WriteOnce(bg, e); err != nil { // the Spool forwards it
		t.Fatal(err)
	}
	got, err := sink.Read(bg, audit.Filter{EventType: audit.EventRevoke}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("the revoke event is in the stream %d times", len(got))
	}
}
