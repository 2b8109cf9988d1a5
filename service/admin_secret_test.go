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

// TestAdminReasonWithKeyIsRefusedNotStored guarantees that an
// administrator reason holding credential material (a key pasted in when it
// leaked) is refused as invalid_lease_request on field reason, as metadata
// is by the same rule (lease.SecretShaped), so it is neither stored in the
// terminal record nor returned by History (auth-boundary.md: "never ...
// stored in a record or returned"). If it were ever accepted, the audit
// event and History must still not hold it.
func TestAdminReasonWithKeyIsRefusedNotStored(t *testing.T) {
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
	if _, err := s.Revoke(ctx, call(admin), AdminInput{Identity: target, LeaseID: got.Lease.LeaseID,
		FencingToken: got.Lease.FencingToken, Reason: reason}); err != nil {
		if le := lease.AsError(err); le == nil || le.Code != lease.CodeInvalidRequest || le.Field != "reason" {
			t.Fatalf("revoke with a key in the reason: got %v, want invalid_lease_request on reason", err)
		}
		if strings.Contains(err.Error(), key) {
			t.Fatalf("the refusal echoes the key: %v", err)
		}
		return
	}
	t.Error("revoke accepted a reason holding an API key")
	for _, e := range sink.OfType(audit.EventRevoke) {
		if strings.Contains(e.Reason, "star_sk_") {
			t.Fatalf("audit holds the key")
		}
	}
	h, err := s.History(ctx, call(reader), got.Lease.LeaseID, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range h.Entries {
		if lease.SecretShaped(en.Reason) || lease.SecretShaped(en.IncidentID) {
			t.Fatalf("the terminal record stores, and History returns to another principal, a reason holding credential material: %q", en.Reason)
		}
	}
}
