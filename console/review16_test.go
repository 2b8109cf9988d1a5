package console_test

// Review 16 (outside security review of the operator console), against a
// fake API behind console.Mount: the fake answers as the real API does,
// but holds chosen answers back until the test lets them go, so the page's
// handling of an answer that arrives after sign-out can be observed.
// The tests noted "found by review" failed on the first version.

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/starintel/starlease/console"
)

const (
	review16KeyA = "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ0_" + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	review16KeyB = "star_sk_v1_01M8VRGTHG7KT4132P3NARGCJ1_" + "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// fakeAPI is the HTTP API as the console sees it. Answers to key A's
// list and lease reads wait on gate; arrived is told when one is waiting.
type fakeAPI struct {
	mu      sync.Mutex
	gate    chan struct{}
	arrived chan string
	lease   string // the lease object GET /{id} answers
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Correlation-ID", "corr-1")
	auth := r.Header.Get("Authorization")
	p := r.URL.Path
	switch {
	case p == "/readyz":
		w.Write([]byte(`{"status":"ok","reason":"","correlation_id":"corr-1"}`))
		return
	case auth != "Bearer "+review16KeyA && auth != "Bearer "+review16KeyB:
		w.WriteHeader(401)
		w.Write([]byte(`{"status":"error","code":"invalid_credential","msg":"Invalid credential","correlation_id":"corr-1","retryable":false}`))
		return
	case p == "/api/v1/target-leases" && r.URL.RawQuery == "":
		w.WriteHeader(400)
		w.Write([]byte(`{"status":"error","code":"invalid_lease_request","msg":"Invalid target lease request","field":"tenant_id","correlation_id":"corr-1","retryable":false}`))
		return
	}
	if auth == "Bearer "+review16KeyA {
		// Key A's reads are slow: they wait for the test.
		f.arrived <- p
		<-f.gate
	}
	f.mu.Lock()
	l := f.lease
	f.mu.Unlock()
	switch {
	case p == "/api/v1/target-leases":
		if auth != "Bearer "+review16KeyA {
			// Key B sees nothing.
			w.Write([]byte(`{"status":"success","code":"lease_listed","correlation_id":"corr-1","leases":[],"next_page_token":""}`))
			return
		}
		w.Write([]byte(`{"status":"success","code":"lease_listed","correlation_id":"corr-1","leases":[` + l + `],"next_page_token":""}`))
	case strings.HasSuffix(p, "/history"):
		w.Write([]byte(`{"status":"success","code":"lease_history","correlation_id":"corr-1","history":[],"next_page_token":""}`))
	default:
		w.Write([]byte(`{"status":"success","code":"lease_inspected","correlation_id":"corr-1","lease":` + l + `}`))
	}
}

func review16Lease(tenant, program, target string) string {
	exp := time.Now().Add(5 * time.Minute).UTC().Format("2006-01-02T15:04:05.000Z")
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	return `{"lock_identity":{"tenant_id":` + jsString(tenant) + `,"program_id":` + jsString(program) +
		`,"target_namespace":"web","target_id":` + jsString(target) + `,"actor_name":"scanner","workflow_name":"default","operation_class":"default"},` +
		`"lease_id":"lease_01SECRETPROGRAMLEASE000000","fencing_token":7,"acquired_at":"` + now + `","renewed_at":"` + now +
		`","expires_at":"` + exp + `","ttl_ms":300000,"state":"active"}`
}

// Found by review (medium): an answer that arrives after sign-out is still
// rendered. signOut forgets the key and clears the panels, but the
// awaiting openLease / loadPage carry on when their fetch resolves: the
// lease detail of the signed-out key appears on the sign-in page, and a
// list answer fills the table that the next key's session then shows (key
// B sees rows that only key A could read). The same happens when a 401
// signs the page out while another read is in flight. Each call should
// carry a session generation (or an AbortController aborted by signOut)
// and drop answers of an older session.
func TestR16SignOutRace(t *testing.T) {
	api := &fakeAPI{gate: make(chan struct{}), arrived: make(chan string, 4),
		lease: review16Lease("acme", "secret-program", "crown-jewels.example")}
	srv := httptest.NewServer(console.Mount(api))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-api.gate:
		default:
			close(api.gate)
		}
	})
	b := startBrowser(t)

	waitArrived := func(t *testing.T, what string) {
		t.Helper()
		select {
		case <-api.arrived:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the page's request never reached the API", what)
		}
	}

	t.Run("Detail", func(t *testing.T) {
		api.gate = make(chan struct{})
		tb := newTab(t, b, srv.URL)
		tb.open()
		tb.signIn(review16KeyA)
		tb.do("open a lease", chromedp.SetValue(chromedp.ID("open-id"), "lease_01SECRETPROGRAMLEASE000000"),
			chromedp.Click(chromedp.ID("open-button")))
		waitArrived(t, "open lease")
		tb.do("sign out", chromedp.Click(chromedp.ID("signout")))
		if !tb.visible("signin") || tb.visible("detail") {
			t.Fatal("sign-out did not show the sign-in form")
		}
		close(api.gate)
		tb.waitIdle()
		time.Sleep(300 * time.Millisecond)
		if tb.visible("detail") || strings.Contains(tb.text("#detail-fields"), "crown-jewels") {
			t.Errorf("after sign-out the page shows the signed-out key's lease: %q (sign-in form visible: %v)",
				tb.text("#detail-fields"), tb.visible("signin"))
		}
	})

	t.Run("List", func(t *testing.T) {
		api.gate = make(chan struct{})
		tb := newTab(t, b, srv.URL)
		tb.open()
		tb.signIn(review16KeyA)
		tb.do("list a program", chromedp.Click(chromedp.ID("by-program")),
			chromedp.SetValue(chromedp.ID("f-tenant"), "acme"),
			chromedp.SetValue(chromedp.ID("f-program"), "secret-program"),
			chromedp.Click(chromedp.ID("list-button")))
		waitArrived(t, "list")
		tb.do("sign out", chromedp.Click(chromedp.ID("signout")))
		close(api.gate)
		tb.waitIdle()
		time.Sleep(300 * time.Millisecond)
		// Another operator signs in with key B, which can read nothing.
		tb.signIn(review16KeyB)
		if rows := tb.leaseIDs(); len(rows) != 0 || tb.visible("lease-table") {
			t.Errorf("key B's session shows key A's rows %v: %q", rows, tb.text("#lease-rows"))
		}
	})
}

// Held up: markup in every server-provided string is text, never markup,
// and nothing runs (no CSP violation, no exception).
func TestR16HostileText(t *testing.T) {
	const x = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>`
	api := &fakeAPI{gate: make(chan struct{}), arrived: make(chan string, 4),
		lease: review16Lease("acme"+x, "p"+x, "t"+x)}
	close(api.gate) // no waiting here
	srv := httptest.NewServer(console.Mount(api))
	t.Cleanup(srv.Close)
	go func() {
		for range api.arrived {
		}
	}()
	b := startBrowser(t)
	tb := newTab(t, b, srv.URL)
	tb.open()
	tb.signIn(review16KeyA)
	tb.listProgram("acme", "p", 25)
	tb.apiAction("open", chromedp.Click(`#lease-rows button.open-lease`))
	tb.do("open force dialog", chromedp.Click(chromedp.ID("detail-force")))
	if n := evalT[int](tb, `document.querySelectorAll('main img, main script, dialog img').length`); n != 0 {
		t.Errorf("%d elements were created from server strings", n)
	}
	if evalT[bool](tb, `window.__pwned === 1`) {
		t.Error("server string ran as script")
	}
	if !strings.Contains(tb.text("#detail-fields"), "<img") {
		t.Errorf("the hostile string is not shown as text: %q", tb.text("#detail-fields"))
	}
	tb.checkPage()
}
