package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// Instance b's own settings pass refers (hist_ret >= idem_ret), so its
// archive never detaches, yet its PEXPIRE cuts the list below a's
// version 3 evidence (a's idempotency retention is longer than b's
// history retention).
func TestReviewS44bMixedIdempotencyRetention(t *testing.T) {
	r := sharedServer(t)
	prefix := randomPrefix()
	a := open(t, r, Options{KeyPrefix: prefix, StoreOptions: leasetest.StoreOptions(), ReferringEvidence: true}) // hist 30d, idem 8d
	so := leasetest.StoreOptions()
	so.IdempotencyRetention = lease.MaxLifetime + time.Millisecond
	so.HistoryRetention = lease.MaxLifetime + 2*time.Millisecond
	b := open(t, r, Options{KeyPrefix: prefix, StoreOptions: so, ReferringEvidence: true})
	req := acquireReq(newIdentity())
	first := acquire4(t, a, req)
	rel := releaseReq(first.Lease)
	if _, err := a.Release(bg, rel); err != nil {
		t.Fatal(err)
	}
	next, err := b.Acquire(bg, acquireReq(req.Identity))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(bg, releaseReq(next.Lease)); err != nil {
		t.Fatal(err)
	}
	hist := a.keys.history(tagOf(first.Lease.LockKey))
	for _, k := range []string{evidenceKey(t, a, req), releaseEvidenceKey(t, a, rel)} {
		v, _ := get(t, a, k)
		if strings.HasPrefix(v, lease.EvidenceRefPrefix) && pexpireTime(t, a, k) > pexpireTime(t, a, hist) {
			t.Errorf("evidence %.4q expires %v after the history list it refers to",
				v, time.Duration(pexpireTime(t, a, k)-pexpireTime(t, a, hist))*time.Millisecond)
		}
	}
	// The list's expiry, simulated.
	a.client.Do(bg, a.client.B().Del().Key(hist).Build())
	if _, err := a.Acquire(bg, req); err != nil {
		t.Errorf("acquire replay after the list expired: %v", err)
	}
	if _, err := a.Release(bg, rel); err != nil {
		t.Errorf("release replay after the list expired: %v", err)
	}
	if _, err := a.Acquire(bg, acquireReq(req.Identity)); err != nil {
		t.Logf("a new acquisition on the identity afterwards: %v", err)
	}
}

// Version 4 history strictness: the tag line kept, another lock key, an
// empty or bare lock key, a trailing newline, scope lines swapped.
func TestReviewS44bHistoryV4Strict(t *testing.T) {
	s := open5(t, Options{StoreOptions: leasetest.StoreOptions()})
	req := acquireReq(newIdentity())
	first := acquire4(t, s, req)
	if _, err := s.Release(bg, releaseReq(first.Lease)); err != nil {
		t.Fatal(err)
	}
	other, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	e := historyEntries(t, s, first.Lease.LockKey)[0]
	if !strings.HasPrefix(e, lease.HistoryScopedPrefix) {
		t.Fatalf("entry %.10q", e)
	}
	key := first.Lease.LockKey
	if _, err := lease.DecodeScopedHistory([]byte(e), key); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(e, "\n", 9)
	tag := strings.TrimPrefix(key, lease.KeyPrefix)
	withTag := strings.Join(lines[:8], "\n") + "\n" + tag + "\n" + lines[8]
	swapped := strings.Join(append([]string{lines[0], lines[2], lines[1]}, lines[3:]...), "\n")
	for name, c := range map[string]struct{ raw, key string }{
		"tag line kept":     {withTag, key},
		"other lock key":    {e, other.Lease.LockKey},
		"empty lock key":    {e, ""},
		"bare prefix":       {e, lease.KeyPrefix},
		"tag only":          {e, tag},
		"trailing newline":  {e + "\n", key},
		"scopes swapped":    {swapped, key},
		"lowercased prefix": {e, strings.ToUpper(lease.KeyPrefix) + tag},
		"crlf":              {strings.Replace(e, "\n", "\r\n", 1), key},
	} {
		if h, err := lease.DecodeScopedHistory([]byte(c.raw), c.key); err == nil {
			t.Errorf("%s: decoded %+v", name, h.Record.LockKey)
		}
	}
}
