package main

// Review s29: serve's GC target, and the Valkey credential store's decode
// memo with its record edited underneath by a raw client.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/valkey"
)

// tuneGC sets GOGC=400 and no memory limit backstop: with a large live
// heap (a bolt migration at open holds the rewritten file in memory,
// README: 609 MB peak for a 252 MB file at GOGC=100; it runs inside serve,
// after tuneGC) the next collection waits for about five times the live
// heap. Observed, not a failure: the test records the goal.
func TestReviewS29GCGoalUnderLargeLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	limit := debug.SetMemoryLimit(-1)
	if p, from := tuneGC(func(string) (string, bool) { return "", false }); p != 400 || from != "default" {
		t.Fatalf("tuneGC = %d from %q", p, from)
	}
	if after := debug.SetMemoryLimit(-1); after != limit {
		t.Fatalf("tuneGC changed the memory limit: %d -> %d", limit, after)
	}
	live := make([][]byte, 0, 64)
	for i := 0; i < 64; i++ {
		live = append(live, make([]byte, 1<<20)) // 64 MiB live
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	ratio := float64(ms.NextGC) / float64(ms.HeapAlloc)
	t.Logf("live heap %d MiB, next GC at %d MiB (x%.1f); memory limit %d (math.MaxInt64 = none)",
		ms.HeapAlloc>>20, ms.NextGC>>20, ratio, limit)
	runtime.KeepAlive(live)
	if ratio < 4.5 {
		t.Fatalf("expected the GC goal near 5x the live heap under GOGC=400, got x%.1f", ratio)
	}
}

// A Valkey record rewritten underneath the server by a raw client (same
// length: one hex digit of the verifier; then the revoked record another
// store wrote; then the original back) is judged on the next request.
func TestReviewS29ValkeyRecordEditedUnderneath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := testenv.StartRedis(t)
	var nb [6]byte
	rand.Read(nb[:])
	ns := "s29" + hex.EncodeToString(nb[:])
	a, err := valkey.OpenCredentialStore(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := valkey.OpenCredentialStore(ctx, valkey.Options{Addr: r.Addr(), KeyPrefix: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pepper, err := auth.NewPepper([]byte("review-s29-pepper-0123456789abcdef0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	key, c, err := auth.Issue(ctx, a, pepper, auth.IssueRequest{PrincipalID: "prn_s29", Class: auth.ClassAPIClient,
		Capabilities: []auth.Capability{auth.CapLease}})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.NewAuthenticator(b, pepper, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := []string{"Bearer " + key}
	try := func(when string, wantOK bool) {
		t.Helper()
		for i := 0; i < 3; i++ { // later ones from the memo
			_, err := authn.Authenticate(ctx, h)
			if (err == nil) != wantOK {
				t.Fatalf("%s (request %d): err %v, want ok=%v", when, i, err, wantOK)
			}
		}
	}
	try("fresh", true)

	cl, err := vk.NewClient(vk.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rk := ns + ":cred:" + c.ID
	orig, err := cl.Do(ctx, cl.B().Get().Key(rk).Build()).AsBytes()
	if err != nil {
		t.Fatalf("raw GET %s: %v", rk, err)
	}
	set := func(v []byte) {
		t.Helper()
		if err := cl.Do(ctx, cl.B().Set().Key(rk).Value(string(v)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	i := bytes.Index(orig, []byte(`"verifier":"`)) + len(`"verifier":"`)
	ed := bytes.Clone(orig)
	if ed[i] == 'a' {
		ed[i] = 'b'
	} else {
		ed[i] = 'a'
	}
	set(ed)
	try("verifier digit edited underneath", false)
	set(orig)
	try("original put back", true)
	if _, err := auth.Revoke(ctx, a, c.ID); err != nil {
		t.Fatal(err)
	}
	try("revoked through the other store", false)
	set(orig)
	try("pre-revocation bytes restored underneath (a rollback, judged as 29bf262 would)", true)
}
