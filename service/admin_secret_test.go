package service

import (
	"context"
	"strings"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// TestAdminReasonWithKeyIsRedactedNotStored guarantees that an
// administrator reason or incident id holding credential material (a key
// pasted in when it leaked, a 64-hex digest) neither blocks the revoke
// (issue 11: no text an administrator chooses may block the action) nor
// reaches the terminal record, History or the audit event: all three hold
// its redacted form, the same one.
func TestAdminReasonWithKeyIsRedactedNotStored(t *testing.T) {
	ctx := context.Background()
	sink := &audittest.Recorder{}
	s, _ := newService(t, sink, Config{})
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	admin := principal(t, "prn-admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease)
	reader := principal(t, "prn-reader3", auth.ClassAPIClient, "tenant:*,program:*", auth.CapAuditRead, auth.CapRead)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	key := "star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32)
	reason := "holder key leaked: Bearer " + key
	incident := "inc-" + strings.Repeat("5e", 32)
	c := call(admin)
	res, err := s.Revoke(ctx, c, AdminInput{Identity: target, LeaseID: got.Lease.LeaseID,
		FencingToken: got.Lease.FencingToken, Reason: reason, IncidentID: incident})
	if err != nil || res.Code != lease.CodeRevoked {
		t.Fatalf("revoke with a key in the reason and a digest in the incident id: %v %v, want lease_revoked", res.Code, err)
	}
	h, err := s.History(ctx, call(reader), got.Lease.LeaseID, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Entries) != 1 {
		t.Fatalf("history has %d entries, want the revoke", len(h.Entries))
	}
	en := h.Entries[0]
	if !strings.HasPrefix(en.Reason, audit.Redacted+":") || !strings.HasPrefix(en.IncidentID, audit.Redacted+":") ||
		en.Reason == en.IncidentID || lease.SecretShaped(en.Reason) || lease.SecretShaped(en.IncidentID) {
		t.Fatalf("the terminal record holds reason %q, incident id %q; want each its own keyed redacted form", en.Reason, en.IncidentID)
	}
	evs := sink.OfType(audit.EventRevoke)
	if len(evs) != 2 {
		t.Fatalf("%d revoke events, want the attempt and the result", len(evs))
	}
	for _, e := range evs {
		if e.Reason != en.Reason || e.IncidentID != en.IncidentID || strings.Contains(e.Reason, "star_sk_") {
			t.Fatalf("audited reason %q, incident id %q; want the record's redacted forms", e.Reason, e.IncidentID)
		}
	}
	// A retry with the same request id is the same request (redaction is
	// deterministic): it replays instead of idempotency_conflict.
	again, err := s.Revoke(ctx, c, AdminInput{Identity: target, LeaseID: got.Lease.LeaseID,
		FencingToken: got.Lease.FencingToken, Reason: reason, IncidentID: incident})
	if err != nil || !again.Replayed || again.Code != lease.CodeRevoked {
		t.Fatalf("retry: %v replayed=%v %v, want the replayed revoke", again.Code, again.Replayed, err)
	}
}
