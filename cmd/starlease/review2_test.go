package main

// Outside review (i11b): c1bbc7c says no text an administrator chooses
// blocks a revoke or force-release over HTTP (a secret-shaped reason or
// incident id is redacted by the server). The CLI's remote mode talks to
// that same server over HTTP, so it must not refuse such a value itself.

import (
	"context"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

func TestReview2RemoteRevokeWithSecretShapedReason(t *testing.T) {
	f := newRemote(t)
	secret := strings.Repeat("9f", 32)
	for _, tc := range []struct{ cmd, flag, value string }{
		{"revoke", "--reason", "holder key leaked: Bearer " + secret},
		{"force-release", "--incident", "inc-" + secret},
	} {
		rec := f.acquire(t)
		r := f.do(t, tc.cmd, append(leaseFlags(rec), tc.flag, tc.value)...)
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Fatalf("%s: the CLI prints the secret:\n%s%s", tc.cmd, r.stdout, r.stderr)
		}
		var p printedLease
		r.ok(t, &p)
		if p.Lease == nil || p.Lease.LeaseID != rec.LeaseID {
			t.Fatalf("%s: %+v", tc.cmd, p)
		}
		h, err := f.api.History(context.Background(), rec.LeaseID, 0, "")
		if err != nil || len(h.History) == 0 {
			t.Fatalf("history: %v", err)
		}
		e := h.History[0]
		if strings.Contains(e.Reason+e.IncidentID, secret) || !strings.HasPrefix(e.Reason+e.IncidentID, "redacted:") {
			t.Fatalf("%s: history holds reason %q incident %q", tc.cmd, e.Reason, e.IncidentID)
		}
	}
	_ = lease.CodeRevoked
}
