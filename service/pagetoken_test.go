package service

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// endLeases acquires and releases n leases of id as p and returns the last
// lease id.
func endLeases(t *testing.T, s *Service, p auth.Principal, id lease.Identity, n int) string {
	t.Helper()
	ctx := context.Background()
	last := ""
	for range n {
		res, err := s.Acquire(ctx, call(p), acquireInput(id))
		if err != nil {
			t.Fatal(err)
		}
		l := res.Lease
		if _, err := s.Release(ctx, call(p), HeldInput{Identity: id, LeaseID: l.LeaseID, FencingToken: l.FencingToken,
			ServiceInstanceID: "inst-1"}); err != nil {
			t.Fatal(err)
		}
		last = l.LeaseID
	}
	return last
}

// A history page token's length says nothing about the server's other
// activity. On bolt the store cursor is the decimal form of a sequence
// global to the whole history bucket, so it grows with every lease that
// ever ended anywhere on the server; the sealed token is padded to one
// length, so an auditor scoped to one tenant cannot learn the order of
// magnitude of other tenants' activity from it. Two worlds that differ
// only in another tenant's ended leases give tokens of one length.
func TestHistoryTokenLengthIndependentOfOtherTenants(t *testing.T) {
	ctx := context.Background()
	auditor := principal(t, "prn-auditor1", auth.ClassAPIClient, "tenant:tenant-main,program:*", auth.CapAuditRead)
	holder := principal(t, "prn-holder1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapLease)
	foreign := target
	foreign.TenantID = "tenant-other"
	lengths := map[int]int{}
	for _, otherEnded := range []int{0, 120} {
		s, _ := listService(t, Config{TargetRate: 1000, TargetBurst: 1000, PrincipalRate: 1000, PrincipalBurst: 1000}, make([]byte, 32))
		endLeases(t, s, holder, foreign, otherEnded) // invisible to the auditor
		last := endLeases(t, s, holder, target, 3)
		h, err := s.History(ctx, call(auditor), last, 1, "")
		if err != nil || h.NextPageToken == "" {
			t.Fatalf("history: %v %+v", err, h)
		}
		lengths[otherEnded] = len(h.NextPageToken)
	}
	if lengths[0] != lengths[120] {
		t.Fatalf("history token length depends on another tenant's ended leases: %v", fmt.Sprint(lengths))
	}
}

// Every token the service seals, list or history, has one length whatever
// its cursor, within lease.MaxPageTokenBytes, and opens to that cursor
// under its own binding only. A cursor too long to pad is refused, not
// sealed. An unpadded token, or one relabelled with another version, does
// not open.
func TestPageTokensHaveOneLength(t *testing.T) {
	ps, err := newPageSealer(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	p := principal(t, "prn-tok1", auth.ClassAPIClient, "tenant:*,program:*", auth.CapRead)
	bind := pageBinding(p, "history", "lock-key")
	for _, n := range []int{1, 2, 9, 10, 20, 100, pageTokenPlain - 2} {
		cursor := strings.Repeat("7", n)
		tok, err := ps.seal(bind, cursor)
		if err != nil || len(tok) != pageTokenLen || len(tok) > lease.MaxPageTokenBytes {
			t.Fatalf("cursor of %d bytes: token of %d bytes (want %d), %v", n, len(tok), pageTokenLen, err)
		}
		if got, err := ps.open(bind, tok); err != nil || got != cursor {
			t.Fatalf("cursor of %d bytes opens to %q, %v", n, got, err)
		}
		if _, err := ps.open(pageBinding(p, "list", "lock-key"), tok); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("opened under another binding: %v", err)
		}
	}
	if _, err := ps.seal(bind, strings.Repeat("7", pageTokenPlain-1)); code(err) != lease.CodeBackendUnavailable {
		t.Fatalf("a cursor too long to pad: %v", err)
	}

	// An unpadded token (the cursor sealed as it is) and a token under
	// another version byte are refused: every token is one length.
	unpadded := func(version byte, ad []byte) string {
		out := make([]byte, 1+pageTokenRandom)
		out[0] = version
		r := out[1:]
		out = ps.aead(r[:12]).Seal(out, r[12:], []byte("cursor-1"), ad)
		return base64.RawURLEncoding.EncodeToString(out)
	}
	for _, tok := range []string{unpadded(pageTokenVersion, versioned(pageTokenVersion, bind)), unpadded(1, bind)} {
		if _, err := ps.open(bind, tok); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("an unpadded or other-version token opened: %v", err)
		}
	}
	tok, _ := ps.seal(bind, "cursor-2")
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	raw[0] = 1
	if _, err := ps.open(bind, base64.RawURLEncoding.EncodeToString(raw)); code(err) != lease.CodeInvalidRequest {
		t.Fatalf("a token relabelled with another version opened: %v", err)
	}
}
