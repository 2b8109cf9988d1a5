package console_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/starintel/starlease/internal/testenv"
)

// TestConsoleInBrowser drives the console in Debian's chromium, headless,
// against a real "starlease serve": sign in, list and page, a lease
// acquired through the API appears with a live remaining TTL,
// force-release with a reason ends it and the audit trail holds the event,
// a wrong key shows the 401 and nothing else, a key scoped to one program
// sees only that program, and the page makes no request outside its own
// origin (every tab's requests are recorded and checked).
func TestConsoleInBrowser(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBinary(t))
	base := srv.URL()
	adminKey, adminCred := srv.CreateKey("ops-admin", "administrator",
		"targets:lease,targets:read,targets:force-release,audit:read", "tenant:*,program:*")
	holderKey, _ := srv.CreateKey("scanner-1", "service_instance", "targets:lease", "tenant:acme,program:*")
	readerKey, _ := srv.CreateKey("alpha-reader", "api_client", "targets:read,audit:read", "tenant:acme,program:alpha")

	alpha := []string{
		acquire(t, base, holderKey, "acme", "alpha", "web-1"),
		acquire(t, base, holderKey, "acme", "alpha", "web-2"),
		acquire(t, base, holderKey, "acme", "alpha", "web-3"),
	}
	beta := acquire(t, base, holderKey, "acme", "beta", "db-1")

	b := startBrowser(t)

	t.Run("SignInListPageAndLiveTTL", func(t *testing.T) {
		tb := newTab(t, b, base)
		tb.open()
		if got := tb.text("#ready-status"); got != "ok (HTTP 200)" {
			t.Errorf("readiness shows %q, want ok (HTTP 200)", got)
		}
		if tb.visible("leases") || !tb.visible("signin") {
			t.Fatal("before sign-in the page shows more than the sign-in form")
		}
		tb.signIn(adminKey)
		checkKeyNowhere(tb, adminKey)
		if got := evalT[string](tb, `document.activeElement.id`); got != "f-tenant" {
			t.Errorf("after sign-in the focus is on %q, want the first list field", got)
		}
		// Every control has a label (or the button its text), as the
		// browser computes it.
		unlabelled := evalT[[]string](tb, `Array.from(document.querySelectorAll('input, select, textarea, button'))
			.filter(e => e.tagName === 'BUTTON' ? e.textContent.trim() === '' && !e.getAttribute('aria-label')
			                                    : e.labels.length === 0 && !e.getAttribute('aria-label'))
			.map(e => e.outerHTML)`)
		if len(unlabelled) != 0 {
			t.Errorf("controls without a label: %v", unlabelled)
		}

		// Two pages of two and one.
		tb.listProgram("acme", "alpha", 2)
		page1 := tb.leaseIDs()
		if len(page1) != 2 {
			t.Fatalf("page 1 holds %v, want 2 leases", page1)
		}
		tb.apiAction("next page", chromedp.Click(chromedp.ID("page-next")))
		tb.waitFor("page 2", `document.getElementById('page-info').textContent.startsWith('Page 2')`)
		page2 := tb.leaseIDs()
		if got := slices.Sorted(slices.Values(append(page1, page2...))); !slices.Equal(got, slices.Sorted(slices.Values(alpha))) {
			t.Fatalf("pages hold %v, want %v", got, alpha)
		}
		if tb.text("#page-info") != "Page 2 (last)" || !evalT[bool](tb, `document.getElementById('page-next').disabled`) {
			t.Errorf("page 2 is not marked the last")
		}
		tb.apiAction("previous page", chromedp.Click(chromedp.ID("page-prev")))
		tb.waitFor("page 1", `document.getElementById('page-info').textContent === 'Page 1'`)
		if got := tb.leaseIDs(); !slices.Equal(got, page1) {
			t.Errorf("page 1 again holds %v, want %v", got, page1)
		}

		// The remaining TTL counts down in the page, without a request.
		before := len(tb.requestsSoFar())
		ttl1 := parseRemaining(t, tb.text("#lease-rows tr .ttl"))
		time.Sleep(1500 * time.Millisecond)
		ttl2 := parseRemaining(t, tb.text("#lease-rows tr .ttl"))
		if !(ttl2 < ttl1 && ttl1 <= 300 && ttl2 > 250) {
			t.Errorf("remaining TTL went from %v s to %v s, want a live countdown from at most 300 s", ttl1, ttl2)
		}
		if after := len(tb.requestsSoFar()); after != before {
			t.Errorf("the countdown made %d requests", after-before)
		}

		// A lease acquired through the API now appears on the next listing.
		fresh := acquire(t, base, holderKey, "acme", "alpha", "web-4")
		alpha = append(alpha, fresh)
		tb.listProgram("acme", "alpha", 25)
		if got := tb.leaseIDs(); !slices.Contains(got, fresh) || len(got) != 4 {
			t.Errorf("after acquiring %s the list shows %v", fresh, got)
		}
		row := evalT[[]string](tb, fmt.Sprintf(`Array.from(document.querySelector('tr[data-lease-id=%s]').cells, c => c.textContent)`, jsString(fresh)))
		if len(row) < 9 || row[1] != "acme" || row[2] != "alpha" || row[3] != "host / web-4" || row[4] != "scanner" || row[7] != "1" {
			t.Errorf("the row of %s reads %q", fresh, row)
		}

		// Every API request carried the key as a bearer token, and only
		// API requests did.
		checkAuthorization(tb, adminKey)

		tb.do("sign out", chromedp.Click(chromedp.ID("signout")))
		if !tb.visible("signin") || tb.visible("leases") || len(tb.leaseIDs()) != 0 {
			t.Error("after sign-out the page still shows the session")
		}
		checkKeyNowhere(tb, adminKey)
		tb.checkPage()
	})

	t.Run("ForceReleaseWithReasonIsAudited", func(t *testing.T) {
		tb := newTab(t, b, base)
		tb.open()
		tb.signIn(adminKey)
		tb.listProgram("acme", "alpha", 25)
		victim := alpha[0]

		// Open the lease from the keyboard.
		tb.apiAction("open the lease by keyboard",
			chromedp.Focus(chromedp.CSS(fmt.Sprintf(`button[aria-label="Open lease %s"]`, victim))),
			chromedp.KeyEvent("\r"))
		tb.waitFor("the detail", `!document.getElementById('detail').hidden`)
		if got := tb.text(".d-lease-id"); got != victim {
			t.Fatalf("detail shows lease %q, want %q", got, victim)
		}
		if got := tb.text(".d-state"); got != "active" {
			t.Fatalf("detail shows state %q", got)
		}

		tb.do("open the force-release dialog", chromedp.Click(chromedp.ID("detail-force")))
		tb.waitFor("the dialog", `document.getElementById('admin-dialog').open`)
		if got := evalT[string](tb, `document.activeElement.id`); got != "admin-reason" {
			t.Errorf("the dialog focused %q, want the reason field", got)
		}

		// Without a reason or an incident id nothing is sent.
		posts := countRequests(tb, "POST")
		tb.do("review without a reason", chromedp.Click(chromedp.ID("admin-next")))
		if got := tb.text("#admin-messages"); !strings.Contains(got, "give a reason or an incident id") {
			t.Errorf("review without a reason shows %q", got)
		}
		if countRequests(tb, "POST") != posts {
			t.Error("a force-release without a reason was sent")
		}

		// A reason that would be markup if the page parsed it as HTML.
		reason := `stuck worker <img src="http://127.0.0.1:9/x.png"> & <b>not bold</b>`
		tb.do("type a reason, then Tab to the incident id and Enter to review",
			chromedp.SendKeys(chromedp.ID("admin-reason"), reason),
			chromedp.KeyEvent("\t"),
			chromedp.KeyEvent("INC-42\r"))
		tb.waitFor("the confirmation step", `!document.getElementById('admin-confirm').hidden`)
		if got := evalT[string](tb, `document.activeElement.id`); got != "admin-confirm" {
			t.Errorf("the confirmation step focused %q, want the confirm button", got)
		}
		confirm := tb.text("#admin-confirm-text")
		if !strings.Contains(confirm, victim) || !strings.Contains(confirm, reason) || !strings.Contains(confirm, "INC-42") {
			t.Errorf("the confirmation reads %q", confirm)
		}
		if countRequests(tb, "POST") != posts {
			t.Error("the force-release was sent before it was confirmed")
		}

		tb.apiAction("confirm with Enter", chromedp.KeyEvent("\r"))
		tb.waitFor("the result", `document.querySelector('#notice .notice-code') !== null || document.querySelector('#admin-messages .envelope') !== null`)
		if e := tb.shownError("#admin-messages"); e.Count != 0 {
			t.Fatalf("force-release failed in the page: %+v", e)
		}
		code, corr := tb.text(".notice-code"), tb.text(".notice-correlation")
		if code != "lease_released" || !strings.HasPrefix(corr, "corr_") {
			t.Fatalf("the page reports code %q, correlation id %q", code, corr)
		}
		if got := tb.text(".d-state"); got != "released" {
			t.Errorf("detail state after force-release: %q", got)
		}
		if !evalT[bool](tb, `document.getElementById('detail-force').disabled && document.getElementById('detail-revoke').disabled`) {
			t.Error("force-release and revoke stay enabled on an ended lease")
		}

		// The identity's terminal history shows it, the reason as text.
		tb.waitFor("the history", `document.querySelectorAll('#history-rows tr').length > 0`)
		hist := evalT[[]map[string]any](tb, `Array.from(document.querySelectorAll('#history-rows tr'), r => ({
			id: r.cells[0].textContent, state: r.querySelector('.h-state').textContent,
			reason: r.querySelector('.h-reason').textContent, incident: r.querySelector('.h-incident').textContent,
			elements: r.querySelector('.h-reason').childElementCount}))`)
		if len(hist) != 1 || hist[0]["id"] != victim || hist[0]["state"] != "released" || hist[0]["reason"] != reason ||
			hist[0]["incident"] != "INC-42" || hist[0]["elements"] != float64(0) {
			t.Errorf("history shows %v", hist)
		}
		if n := evalT[int](tb, `document.querySelectorAll('main img, main b').length`); n != 0 {
			t.Errorf("the reason was parsed as markup: %d elements", n)
		}
		if got := tb.leaseIDs(); slices.Contains(got, victim) {
			t.Errorf("the list still shows %s: %v", victim, got)
		}

		// The audit trail holds the event, under the correlation id shown.
		var found map[string]any
		for _, ev := range auditEvents(t, srv.DataDir()) {
			if ev["event_type"] == "target_lease_force_release" && ev["correlation_id"] == corr && ev["result_code"] == "lease_force_released" {
				found = ev
			}
		}
		if found == nil {
			t.Fatalf("no force-release event with correlation id %s in audit.jsonl", corr)
		}
		if found["lease_id"] != victim || found["reason"] != reason || found["incident_id"] != "INC-42" ||
			found["principal_id"] != "ops-admin" || found["decision"] != "allow" || found["resulting_state"] != "released" {
			t.Errorf("the audit event is %v", found)
		}
		// And the API agrees.
		if status, out := apiCall(t, base, adminKey, "GET", "/api/v1/target-leases/"+victim, nil); status != 200 ||
			out["lease"].(map[string]any)["state"] != "released" {
			t.Errorf("inspect after force-release: %d %v", status, out)
		}
		tb.checkPage()
	})

	t.Run("RevokeNeedsConfirmation", func(t *testing.T) {
		tb := newTab(t, b, base)
		tb.open()
		tb.signIn(adminKey)
		victim := alpha[1]
		tb.apiAction("open the lease by id", chromedp.SendKeys(chromedp.ID("open-id"), victim+"\r"))
		tb.waitFor("the detail", `document.querySelector('.d-lease-id') !== null`)

		// Escape at the confirmation step sends nothing.
		tb.do("revoke, incident id only, review, then Escape",
			chromedp.Click(chromedp.ID("detail-revoke")),
			chromedp.SendKeys(chromedp.ID("admin-incident"), "INC-7\r"))
		tb.waitFor("the confirmation step", `!document.getElementById('admin-confirm').hidden`)
		if got := tb.text("#admin-confirm"); got != "Confirm revoke" {
			t.Errorf("the confirm button reads %q", got)
		}
		tb.do("Escape", chromedp.KeyEvent("\x1b"))
		tb.waitFor("the dialog to close", `!document.getElementById('admin-dialog').open`)
		if n := countRequests(tb, "POST"); n != 0 {
			t.Fatalf("%d POST requests after Escape", n)
		}
		if got := evalT[string](tb, `document.activeElement.id`); got != "detail-revoke" {
			t.Errorf("after the dialog the focus is on %q, want the revoke button", got)
		}
		if status, out := apiCall(t, base, adminKey, "GET", "/api/v1/target-leases/"+victim, nil); status != 200 ||
			out["lease"].(map[string]any)["state"] != "active" {
			t.Fatalf("after Escape the lease is %d %v", status, out)
		}

		tb.do("revoke, incident id only, review, confirm",
			chromedp.Click(chromedp.ID("detail-revoke")),
			chromedp.SendKeys(chromedp.ID("admin-incident"), "INC-7\r"))
		tb.waitFor("the confirmation step", `!document.getElementById('admin-confirm').hidden`)
		tb.apiAction("confirm", chromedp.Click(chromedp.ID("admin-confirm")))
		tb.waitFor("the result", `document.querySelector('#notice .notice-code') !== null || document.querySelector('#admin-messages .envelope') !== null`)
		if e := tb.shownError("#admin-messages"); e.Count != 0 {
			t.Fatalf("revoke failed in the page: %+v", e)
		}
		corr := tb.text(".notice-correlation")
		if got := tb.text(".d-state"); got != "revoked" {
			t.Errorf("detail state after revoke: %q", got)
		}
		tb.waitFor("the history", `document.querySelectorAll('#history-rows tr').length > 0`)
		if st, inc := tb.text("#history-rows tr .h-state"), tb.text("#history-rows tr .h-incident"); st != "revoked" || inc != "INC-7" {
			t.Errorf("history shows state %q incident %q", st, inc)
		}
		var found bool
		for _, ev := range auditEvents(t, srv.DataDir()) {
			found = found || ev["event_type"] == "target_lease_revoke" && ev["correlation_id"] == corr &&
				ev["lease_id"] == victim && ev["incident_id"] == "INC-7" && ev["resulting_state"] == "revoked"
		}
		if !found {
			t.Errorf("no revoke event with correlation id %s in audit.jsonl", corr)
		}
		tb.checkPage()
	})

	t.Run("WrongKeyShows401AndNothingElse", func(t *testing.T) {
		tb := newTab(t, b, base)
		tb.open()
		// A real credential id with the wrong secret.
		wrong := "star_sk_v1_" + adminCred + "_" + strings.Repeat("0", 64)
		tb.apiAction("sign in with a wrong key", chromedp.SendKeys(chromedp.ID("key"), wrong+"\r"))
		tb.waitFor("the error", `document.querySelector('#messages .envelope') !== null`)
		e := tb.shownError("#messages")
		if e.Status != "401" || e.Code != "invalid_credential" || e.Msg != "Invalid credential" ||
			!regexp.MustCompile(`^corr_[0-9A-Z]{26}$`).MatchString(e.Correlation) || e.Count != 1 {
			t.Errorf("the page shows %+v", e)
		}
		if !tb.visible("signin") || tb.visible("leases") || tb.visible("session") || tb.visible("detail") {
			t.Error("a wrong key shows more than the sign-in form")
		}
		if tb.text("#notice") != "" || len(tb.leaseIDs()) != 0 {
			t.Error("a wrong key shows a notice or leases")
		}
		body := evalT[string](tb, `document.body.innerText`)
		for _, s := range append(slices.Clone(alpha), beta, "acme", "alpha") {
			if strings.Contains(body, s) {
				t.Errorf("the page shows %q after a wrong key", s)
			}
		}
		if got := evalT[string](tb, `document.getElementById('key').value`); got != "" {
			t.Error("the key field keeps the wrong key")
		}
		var api []request
		for _, r := range tb.requestsSoFar() {
			if strings.Contains(r.URL, "/api/") {
				api = append(api, r)
			}
		}
		if len(api) != 1 || api[0].Method != "GET" || api[0].URL != base+"/api/v1/target-leases" {
			t.Errorf("a wrong key made these API requests: %v", api)
		}
		audited := false
		for _, ev := range auditEvents(t, srv.DataDir()) {
			audited = audited || ev["event_type"] == "target_lease_auth_failed" && ev["correlation_id"] == e.Correlation
		}
		if !audited {
			t.Errorf("no auth_failed event with the correlation id shown (%s)", e.Correlation)
		}
		checkKeyNowhere(tb, wrong)
		tb.checkPage()
	})

	t.Run("ProgramScopedKeySeesOnlyItsProgram", func(t *testing.T) {
		// What an unscoped key sees of program alpha, to compare.
		_, out := apiCall(t, base, adminKey, "GET", "/api/v1/target-leases?tenant_id=acme&program_id=alpha", nil)
		var want []string
		for _, l := range out["leases"].([]any) {
			want = append(want, l.(map[string]any)["lease_id"].(string))
		}
		slices.Sort(want)

		tb := newTab(t, b, base)
		tb.open()
		tb.signIn(readerKey)

		tb.listProgram("acme", "alpha", 25)
		if got := slices.Sorted(slices.Values(tb.leaseIDs())); len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("program alpha shows %v, want %v", got, want)
		}

		tb.listProgram("acme", "beta", 25)
		if e := tb.shownError("#messages"); e.Status != "403" || e.Code != "access_denied" || !strings.HasPrefix(e.Correlation, "corr_") {
			t.Errorf("listing program beta shows %+v, want 403 access_denied", e)
		}
		if got := tb.leaseIDs(); len(got) != 0 {
			t.Errorf("program beta shows %v", got)
		}

		// The holder has leases in both programs; the key sees alpha's.
		tb.listOwner("scanner-1")
		got := tb.leaseIDs()
		if slices.Contains(got, beta) || !slices.Equal(slices.Sorted(slices.Values(got)), want) {
			t.Errorf("owner scanner-1 shows %v, want alpha's %v", got, want)
		}
		programs := evalT[[]string](tb, `Array.from(document.querySelectorAll('#lease-rows tr'), r => r.cells[2].textContent)`)
		for _, p := range programs {
			if p != "alpha" {
				t.Errorf("a row of program %q", p)
			}
		}

		// Beta's lease by id is not found for this key.
		tb.apiAction("open beta's lease by id",
			chromedp.SetValue(chromedp.ID("open-id"), beta), chromedp.Click(chromedp.ID("open-button")))
		tb.waitFor("the error", `document.querySelector('#messages .envelope') !== null`)
		if e := tb.shownError("#messages"); e.Status != "404" || e.Code != "lease_not_found" {
			t.Errorf("opening beta's lease shows %+v", e)
		}
		if tb.visible("detail") {
			t.Error("the detail of beta's lease is shown")
		}
		checkAuthorization(tb, readerKey)
		tb.checkPage()
	})

	t.Run("PolicyStopsRequestsToOtherOrigins", func(t *testing.T) {
		var hits atomic.Int32
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.Header().Set("Access-Control-Allow-Origin", "*")
			w.Write([]byte("ok"))
		}))
		defer other.Close()
		tb := newTab(t, b, base)
		tb.open()
		// Script run in the page: a fetch, an image and an inline script
		// aimed elsewhere are refused by the page's policy.
		got, err := runWithTimeout(tb.ctx, actionTimeout, chromedp.Evaluate[string](fmt.Sprintf(`(async () => {
			const img = new Image(); img.src = %s;
			const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; document.body.appendChild(s);
			try { await fetch(%s, {mode: 'no-cors'}); return 'sent'; } catch (e) { return 'blocked'; }
		})()`, jsString(other.URL+"/img.png"), jsString(other.URL+"/fetch")), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if got != "blocked" {
			t.Errorf("a fetch to another origin was %s", got)
		}
		tb.waitFor("the violations", `window.__cspViolations.length >= 3`)
		v := strings.Join(evalT[[]string](tb, `window.__cspViolations`), "\n")
		for _, want := range []string{"connect-src", "img-src", "script-src"} {
			if !strings.Contains(v, want) {
				t.Errorf("no %s violation in:\n%s", want, v)
			}
		}
		if evalT[bool](tb, `window.__inline === 1`) {
			t.Error("an inline script ran")
		}
		time.Sleep(200 * time.Millisecond)
		if n := hits.Load(); n != 0 {
			t.Errorf("the other origin received %d requests", n)
		}
	})

	// What a failing test leaves: the same call its cleanup makes.
	t.Run("ScreenshotOfTheFailingPageIsSaved", func(t *testing.T) {
		tb := newTab(t, b, base)
		tb.open()
		dir := t.TempDir()
		path, err := saveScreenshot(tb.ctx, dir, t.Name())
		if err != nil {
			t.Fatal(err)
		}
		png, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(path) != dir || !strings.HasPrefix(filepath.Base(path), "TestConsoleInBrowser_ScreenshotOfTheFailingPageIsSaved-") ||
			!bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 2000 {
			t.Errorf("screenshot %s: %d bytes, starts %q", path, len(png), png[:min(8, len(png))])
		}
	})

	// No key reached the server's output or its audit log.
	audit := fmt.Sprint(auditEvents(t, srv.DataDir()))
	for _, k := range []string{adminKey, holderKey, readerKey} {
		secret := k[len(k)-64:]
		if strings.Contains(string(srv.Stdout()), secret) || strings.Contains(string(srv.Stderr()), secret) || strings.Contains(audit, secret) {
			t.Errorf("a key's secret reached the server's output or audit log")
		}
	}
}

// parseRemaining reads a remaining TTL as the page shows it ("42.3 s",
// "4 min 05 s") in seconds.
func parseRemaining(t *testing.T, s string) float64 {
	t.Helper()
	if m := regexp.MustCompile(`^(\d+) min (\d\d) s$`).FindStringSubmatch(s); m != nil {
		mins, _ := strconv.Atoi(m[1])
		secs, _ := strconv.Atoi(m[2])
		return float64(mins*60 + secs)
	}
	if m := regexp.MustCompile(`^(\d+\.\d) s$`).FindStringSubmatch(s); m != nil {
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	t.Fatalf("remaining TTL %q is not in a known form", s)
	return 0
}

func countRequests(tb *tab, method string) int {
	n := 0
	for _, r := range tb.requestsSoFar() {
		if r.Method == method {
			n++
		}
	}
	return n
}

// checkKeyNowhere checks that key is in no address, cookie, storage, field
// or markup of the page.
func checkKeyNowhere(tb *tab, key string) {
	tb.t.Helper()
	got, err := runWithTimeout(tb.ctx, actionTimeout, chromedp.Evaluate[map[string]any](fmt.Sprintf(`(async (key) => ({
		markup: document.documentElement.outerHTML.includes(key),
		fields: Array.from(document.querySelectorAll('input, textarea')).some(e => e.value.includes(key)),
		address: location.href.includes(key) || document.referrer.includes(key),
		cookie: document.cookie,
		local: localStorage.length,
		session: sessionStorage.length,
		idb: (await indexedDB.databases()).length,
		caches: (await caches.keys()).length,
	}))(%s)`, jsString(key)), chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("look for the key: %v", err)
	}
	want := map[string]any{"markup": false, "fields": false, "address": false, "cookie": "",
		"local": float64(0), "session": float64(0), "idb": float64(0), "caches": float64(0)}
	for k, v := range want {
		if got[k] != v {
			tb.t.Errorf("key check %s: got %v, want %v", k, got[k], v)
		}
	}
	secret := key[len(key)-64:]
	for _, r := range tb.requestsSoFar() {
		if strings.Contains(r.URL, secret) {
			tb.t.Errorf("a request address holds the key: %s %s", r.Method, r.URL)
		}
	}
	cookies, err := runWithTimeout(tb.ctx, actionTimeout, chromedp.Evaluate[string](`document.cookie`))
	if err != nil || cookies != "" {
		tb.t.Errorf("cookies: %q %v", cookies, err)
	}
}

// checkAuthorization checks that every API request of the page carried
// exactly "Authorization: Bearer key" and no cookie, and no other request
// carried either.
func checkAuthorization(tb *tab, key string) {
	tb.t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for i, r := range tb.requests {
		h := tb.headers[i]
		auth, cookie := h["Authorization"], h["Cookie"]
		switch {
		case cookie != "":
			tb.t.Errorf("%s %s sent a cookie", r.Method, r.URL)
		case strings.HasPrefix(r.URL, tb.origin+"/api/") && auth != "Bearer "+key:
			tb.t.Errorf("%s %s did not carry the key as its bearer token", r.Method, r.URL)
		case !strings.HasPrefix(r.URL, tb.origin+"/api/") && auth != "":
			tb.t.Errorf("%s %s carried an Authorization header", r.Method, r.URL)
		}
	}
}
