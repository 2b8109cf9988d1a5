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

// Review of session 46: a commit's audit events said nothing of which
// write they were for, so the replay of an earlier authorization after a
// revoke read as a fresh commit_authorized for the revoked lease, two
// writes' authorizations were alike, and a stale holder's refused commit
// named no lease. Each event now carries the commit id as its request id,
// and a refused one the lease and token the caller presented; a commit id
// that looks like credential material is redacted like any other value,
// to the same form each time.
func TestS46CommitEventsNameTheirWrite(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	s, _ := newService(t, rec, Config{})
	p := principal(t, "prn-s46holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	adm := principal(t, "prn-s46admin2", auth.ClassAdministrator, "tenant:*,program:*", auth.CapForceRelease)
	got, err := s.Acquire(ctx, call(p), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	secretShaped := strings.Repeat("c0", 32) // 64 hex digits, as a payload digest used as an id would be
	commit := func(commitID, doc string) (lease.CommitResult, error) {
		return s.AuthorizeCommit(ctx, call(p), CommitInput{Identity: target, LeaseID: got.Lease.LeaseID,
			FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: commitID,
			ExecutionID: "exec-1", JobID: "job-1", Target: doc, PayloadSHA256: lease.PayloadSHA256([]byte(doc))})
	}
	for _, c := range [][2]string{{"c-1", "doc-1"}, {"c-2", "doc-2"}, {secretShaped, "doc-3"}} {
		if _, err := commit(c[0], c[1]); err != nil {
			t.Fatalf("commit %s: %v", c[1], err)
		}
	}
	authorized := rec.OfType(audit.EventCommitAuthorized)
	if len(authorized) != 3 || authorized[0].RequestID != "c-1" || authorized[1].RequestID != "c-2" {
		t.Fatalf("commit_authorized events %+v: want request ids c-1, c-2 and the third's redacted form", authorized)
	}
	redacted := authorized[2].RequestID
	if !strings.HasPrefix(redacted, audit.Redacted+":") || strings.Contains(redacted, secretShaped) {
		t.Fatalf("a 64-hex commit id is audited as %q, want its keyed redacted form", redacted)
	}
	if _, err := s.Revoke(ctx, call(adm), AdminInput{Identity: target, LeaseID: got.Lease.LeaseID,
		FencingToken: got.Lease.FencingToken, Reason: "drill"}); err != nil {
		t.Fatal(err)
	}
	// The replays after the revoke answer from evidence; their events
	// repeat the original's request id, lease and token.
	for i, c := range [][2]string{{"c-1", "doc-1"}, {secretShaped, "doc-3"}} {
		res, err := commit(c[0], c[1])
		if err != nil || !res.Replayed {
			t.Fatalf("replay of %s after the revoke: %v (replayed %v)", c[1], err, res.Replayed)
		}
		all := rec.OfType(audit.EventCommitAuthorized)
		replay, original := all[len(all)-1], authorized[2*i]
		if replay.RequestID != original.RequestID || replay.LeaseID != original.LeaseID ||
			replay.FencingToken == nil || *replay.FencingToken != *original.FencingToken {
			t.Fatalf("the replay of %s is audited as request %q lease %q, the original as %q %q", c[1],
				replay.RequestID, replay.LeaseID, original.RequestID, original.LeaseID)
		}
	}
	// A new write after the revoke is refused, and its event names the
	// commit and the lease the stale holder presented.
	if _, err := commit("c-4", "doc-4"); code(err) != lease.CodeLost {
		t.Fatalf("a new commit after the revoke: %v, want lease_lost", err)
	}
	rejected := rec.OfType(audit.EventCommitRejected)
	if len(rejected) != 1 {
		t.Fatalf("%d commit_rejected events, want 1", len(rejected))
	}
	r := rejected[0]
	if r.RequestID != "c-4" || r.LeaseID != got.Lease.LeaseID || r.FencingToken == nil || *r.FencingToken != got.Lease.FencingToken ||
		r.Decision != audit.DecisionDeny {
		t.Fatalf("the refused commit is audited as request %q lease %q token %v decision %s; want c-4, %s, %d, deny",
			r.RequestID, r.LeaseID, r.FencingToken, r.Decision, got.Lease.LeaseID, got.Lease.FencingToken)
	}
}

// Second review of session 46: the refused commit's event took the
// caller's claimed token as it came, and one outside 1..MaxFencingToken
// made the event invalid, so no sink wrote it (an access denial
// included). Such a token is now left out of the event, which is written.
func TestS46RefusedCommitWithOutOfRangeTokenIsAudited(t *testing.T) {
	ctx := context.Background()
	rec := &audittest.Recorder{}
	s, _ := newService(t, rec, Config{})
	outsider := principal(t, "prn-s46outsider4", auth.ClassAPIClient, "tenant:tenant-other,program:*", auth.CapLease)
	holder := principal(t, "prn-s46holder5", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	got, err := s.Acquire(ctx, call(holder), acquireInput(target))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  auth.Principal
		tok  uint64
		want lease.Code
	}{
		{outsider, lease.MaxFencingToken + 1, lease.CodeAccessDenied},
		{outsider, ^uint64(0), lease.CodeAccessDenied},
		{holder, lease.MaxFencingToken + 1, lease.CodeInvalidRequest},
		{holder, 0, lease.CodeInvalidRequest},
	} {
		before := len(rec.OfType(audit.EventCommitRejected))
		_, err := s.AuthorizeCommit(ctx, call(c.who), CommitInput{Identity: target, LeaseID: got.Lease.LeaseID,
			FencingToken: c.tok, ServiceInstanceID: "inst-1", Sink: "couchdb", CommitID: "c-range",
			ExecutionID: "exec-1", JobID: "job-1", Target: "doc-1", PayloadSHA256: lease.PayloadSHA256([]byte("doc-1"))})
		if code(err) != c.want {
			t.Fatalf("%s with token %d: %v, want %s", c.who.ID, c.tok, err, c.want)
		}
		evs := rec.OfType(audit.EventCommitRejected)
		if len(evs) != before+1 {
			t.Fatalf("%s with token %d: %d commit_rejected events written, want one", c.who.ID, c.tok, len(evs)-before)
		}
		if e := evs[len(evs)-1]; e.FencingToken != nil || e.RequestID != "c-range" || e.LeaseID != got.Lease.LeaseID {
			t.Fatalf("its event: token %v, request %q, lease %q; want no token, c-range, the claimed lease", e.FencingToken, e.RequestID, e.LeaseID)
		}
	}
}
