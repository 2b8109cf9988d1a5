package client

// Review 4 (HTTP perf branch) attacks on the client's one-parse decoding of
// answers (decodeStrict, 8ce34d0) and its shared default transport: a
// malicious or compromised server's answer the fast path takes with another
// meaning than lease.DecodeStrict, and leakage between clients sharing the
// transport.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// review4Mutations derives bodies from the canonical body s: every key
// spelled another way, duplicated, nulled; numbers and strings written
// another way; trailing data.
func review4Mutations(s string) map[string]string {
	out := map[string]string{"canonical": s, "canonical+nl": s + "\n", "canonical+2nl": s + "\n\n",
		"trailing {}": s + "{}", "null": "null", "{}": "{}", "bom": "\ufeff" + s}
	var keys []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				keys = append(keys, k)
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	var tree any
	json.Unmarshal([]byte(s), &tree)
	walk(tree)
	for _, k := range keys {
		q := `"` + k + `":`
		i := strings.Index(s, q)
		if i < 0 {
			continue
		}
		var raw json.RawMessage
		if json.NewDecoder(strings.NewReader(s[i+len(q):])).Decode(&raw) != nil {
			continue
		}
		val := string(raw)
		member := q + val
		up := strings.ToUpper(k[:1]) + k[1:]
		out["case "+k] = strings.Replace(s, q, `"`+up+`":`, 1)
		if strings.Contains(k, "s") {
			out["long-s "+k] = strings.Replace(s, q, `"`+strings.Replace(k, "s", "ſ", 1)+`":`, 1)
		}
		if strings.Contains(k, "k") {
			out["kelvin "+k] = strings.Replace(s, q, `"`+strings.Replace(k, "k", "\u212a", 1)+`":`, 1)
		}
		out["escaped key "+k] = strings.Replace(s, q, `"\u00`+fmt.Sprintf("%02x", k[0])+k[1:]+`":`, 1)
		out["dup same "+k] = strings.Replace(s, member, member+","+member, 1)
		out["dup case "+k] = strings.Replace(s, member, member+`,"`+up+`":`+val, 1)
		out["dup null "+k] = strings.Replace(s, member, q+"null,"+member, 1)
		out["null "+k] = strings.Replace(s, member, q+"null", 1)
		out["unknown "+k] = strings.Replace(s, member, member+`,"`+k+`_x":1`, 1)
		switch {
		case val[0] == '"' && len(val) > 2:
			out["escaped value "+k] = strings.Replace(s, member, q+`"\u00`+fmt.Sprintf("%02x", val[1])+val[2:], 1)
			out["html value "+k] = strings.Replace(s, member, q+`"\u003c`+val[1:], 1)
			out["lone surrogate "+k] = strings.Replace(s, member, q+`"\ud800`+val[1:], 1)
		case val[0] >= '0' && val[0] <= '9':
			out["float "+k] = strings.Replace(s, member, q+val+".0", 1)
			out["exp "+k] = strings.Replace(s, member, q+val+"e0", 1)
			out["big "+k] = strings.Replace(s, member, q+"18446744073709551616", 1)
			out["dup bigger "+k] = strings.Replace(s, member, member+","+q+"99", 1)
			out["dup smaller first "+k] = strings.Replace(s, member, q+"1,"+member, 1)
		}
	}
	return out
}

func review4Compare[T any](t *testing.T, name, body string) {
	t.Helper()
	var got, want T
	gerr, werr := decodeStrict([]byte(body), &got), lease.DecodeStrict([]byte(body), &want)
	if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
		t.Errorf("%s %T %q: decodeStrict %v, lease.DecodeStrict %v", name, got, body, gerr, werr)
		return
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Errorf("%s %T %q: decodeStrict %+v, lease.DecodeStrict %+v", name, got, body, got, want)
	}
}

func review4Answers() ([]string, []string) {
	at := lease.At(time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC))
	id := lease.Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x", ActorName: "a",
		WorkflowName: "w", OperationClass: "o"}
	l := wire.Lease{LockIdentity: id, LeaseID: "lease_1", FencingToken: 2, TTLMs: 1000, State: "active",
		AcquiredAt: at, RenewedAt: at, ExpiresAt: at.Add(time.Second)}
	tok := "next"
	ms := int64(250)
	var ok []string
	for _, s := range []wire.Success{
		{Status: "success", Code: "lease_acquired", CorrelationID: "corr_1", Lease: &l},
		{Status: "success", Code: "lease_released", CorrelationID: "corr_1", Lease: &l, Current: &l, Replayed: true},
		{Status: "success", Code: "lease_listed", CorrelationID: "corr_1", Leases: []wire.Lease{l, l}, NextPageToken: &tok},
		{Status: "success", Code: "lease_history", CorrelationID: "corr_1", History: []wire.HistoryEntry{{Lease: l, EndedAt: at, Reason: "r", IncidentID: "i"}}},
		{Status: "success", Code: "commit_authorized", CorrelationID: "corr_1", Commit: &wire.Commit{LockKey: "k", Sink: "s",
			CommitID: "c", LeaseID: "lease_1", FencingToken: 2, ExecutionID: "e", JobID: "j", TraceID: "tr", Target: "x",
			PayloadSHA256: "ab", CommitSeq: 3, AcceptedAt: at, BackendTime: at}},
	} {
		b, err := json.Marshal(s)
		if err != nil {
			panic(err)
		}
		ok = append(ok, string(b))
	}
	b, _ := json.Marshal(wire.Error{Status: "error", Code: "lease_conflict", Msg: "m", Field: "f", CorrelationID: "c",
		Retryable: true, RetryAfterMs: &ms})
	return ok, []string{string(b)}
}

// HELD. On every answer shape and every mutation, the one-parse path gives
// lease.DecodeStrict's verdict, error text and value.
func TestReview4ClientFastPathMatchesDecodeStrict(t *testing.T) {
	oks, errs := review4Answers()
	n := 0
	for _, s := range oks {
		for name, body := range review4Mutations(s) {
			review4Compare[wire.Success](t, name, body)
			n++
			if strings.HasPrefix(name, "dup ") || strings.HasPrefix(name, "case ") || strings.HasPrefix(name, "long-s ") ||
				strings.HasPrefix(name, "kelvin ") {
				var v wire.Success
				if decodeStrict([]byte(body), &v) == nil {
					t.Errorf("%s: accepted %q", name, body)
				}
			}
		}
	}
	if n < 300 {
		t.Fatalf("only %d mutations", n)
	}
	for _, s := range errs {
		for name, body := range review4Mutations(s) {
			review4Compare[wire.Error](t, name, body)
		}
	}
}

// HELD. A compromised server answers an acquire with its own encoding but
// a second fencing_token (or lease_id, or state) that the last-wins
// decoder would take: the client refuses the answer (outcome unknown) and
// never hands out the later value.
func TestReview4ClientRefusesDuplicateFencingToken(t *testing.T) {
	oks, _ := review4Answers()
	canon := oks[0]
	for name, body := range map[string]string{
		"dup token":    strings.Replace(canon, `"fencing_token":2`, `"fencing_token":2,"fencing_token":99`, 1),
		"dup token nl": strings.Replace(canon, `"fencing_token":2`, `"fencing_token":2,"fencing_token":99`, 1) + "\n",
		"case token":   strings.Replace(canon, `"fencing_token":2`, `"fencing_token":2,"Fencing_token":99`, 1),
		"dup lease id": strings.Replace(canon, `"lease_id":"lease_1"`, `"lease_id":"lease_1","lease_id":"lease_evil"`, 1),
		"dup state":    strings.Replace(canon, `"state":"active"`, `"state":"released","state":"active"`, 1),
		"dup code":     strings.Replace(canon, `"code":"lease_acquired"`, `"code":"lease_released","code":"lease_acquired"`, 1),
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Correlation-ID", "corr_1")
			io.WriteString(w, body)
		}))
		c, err := New(srv.URL, "star_sk_v1_key")
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Acquire(context.Background(), AcquireRequest{LockIdentity: lease.Identity{TenantID: "t"}, TTLMs: 1000})
		srv.Close()
		var ce *Error
		if err == nil || !asError(err, &ce) || ce.Code != lease.CodeOutcomeUnknown {
			t.Errorf("%s: %+v %v, want outcome_unknown", name, res, err)
		}
	}
}

func asError(err error, out **Error) bool {
	e, ok := err.(*Error)
	*out = e
	return ok
}

// HELD. Clients sharing the default transport do not leak into each
// other: each request carries only its own client's key, a cookie one
// server sets is never sent (no jar), a redirect is not followed (the
// second listener sees nothing), and a client made WithHTTPClient with its
// own TLS roots neither lends them to default clients (which then refuse
// the test server's certificate) nor has its requests go through the
// shared transport.
func TestReview4SharedTransportNoCrossClientLeak(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	var other int
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		other++
		mu.Unlock()
	}))
	defer elsewhere.Close()
	errBody := `{"status":"error","code":"lease_conflict","msg":"m","correlation_id":"corr_1","retryable":true,"retry_after_ms":250}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization")+"|"+r.Header.Get("Cookie"))
		mu.Unlock()
		http.SetCookie(w, &http.Cookie{Name: "session", Value: r.Header.Get("Authorization")})
		if strings.HasSuffix(r.Header.Get("Authorization"), "redirect") {
			w.Header().Set("Location", elsewhere.URL+r.URL.Path)
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, errBody)
	}))
	defer srv.Close()
	a, _ := New(srv.URL, "star_sk_v1_keyA")
	b, _ := New(srv.URL, "star_sk_v1_keyB")
	r, _ := New(srv.URL, "star_sk_v1_redirect")
	if a.hc.Transport != defaultTransport || b.hc == a.hc {
		t.Fatal("default clients do not share the transport but not the http.Client")
	}
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		for _, c := range []*Client{a, b, r} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Inspect(context.Background(), lease.Identity{TenantID: "t"})
			}()
		}
	}
	wg.Wait()
	counts := map[string]int{}
	for _, s := range seen {
		counts[s]++
	}
	if len(counts) != 3 || counts["Bearer star_sk_v1_keyA|"] != 20 || counts["Bearer star_sk_v1_keyB|"] != 20 ||
		counts["Bearer star_sk_v1_redirect|"] != 20 {
		t.Fatalf("requests seen: %v", counts)
	}
	if other != 0 {
		t.Fatalf("%d requests followed a redirect to another listener", other)
	}

	// TLS: the test server's roots live only in the custom client.
	tsrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, errBody)
	}))
	defer tsrv.Close()
	custom := tsrv.Client()
	own, _ := New(tsrv.URL, "star_sk_v1_keyA", WithHTTPClient(custom))
	if own.hc.Transport == defaultTransport {
		t.Fatal("a WithHTTPClient client uses the shared transport")
	}
	_, err := own.Inspect(context.Background(), lease.Identity{TenantID: "t"})
	if ce, ok := err.(*Error); !ok || ce.Code != lease.CodeConflict {
		t.Fatalf("custom TLS client: %v", err)
	}
	def, _ := New(tsrv.URL, "star_sk_v1_keyB")
	_, err = def.Inspect(context.Background(), lease.Identity{TenantID: "t"})
	if ce, ok := err.(*Error); !ok || ce.Code == lease.CodeConflict {
		t.Fatalf("a default client reached a server whose certificate only another client trusts: %v", err)
	}
	if tr := defaultTransport.(*http.Transport); tr.TLSClientConfig != nil && (tr.TLSClientConfig.RootCAs != nil ||
		tr.TLSClientConfig.InsecureSkipVerify) {
		t.Fatalf("the shared transport's TLS config was changed: %+v", tr.TLSClientConfig)
	}
}
