package client

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// decodeStrict gives lease.DecodeStrict's verdict and error on every body,
// taking one parse for the server's own encoding.
func TestDecodeStrictAsLease(t *testing.T) {
	ms := int64(250)
	at := lease.At(time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC))
	ok, err := json.Marshal(wire.Success{Status: "success", Code: "lease_released", CorrelationID: "corr_1",
		Lease: &wire.Lease{LeaseID: "lease_1", FencingToken: 2, TTLMs: 1000, State: "released",
			AcquiredAt: at, RenewedAt: at, ExpiresAt: at.Add(time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := json.Marshal(wire.Error{Status: "error", Code: "lease_conflict", Msg: "m", CorrelationID: "c", Retryable: true, RetryAfterMs: &ms})
	s := string(ok)
	for _, body := range []string{
		s, s + "\n", s + " \n", " " + s, s + "{}", s[:len(s)-1],
		strings.Replace(s, `"status":"success",`, `"status":"success","status":"success",`, 1),
		strings.Replace(s, `"code"`, `"Code"`, 1),
		strings.Replace(s, `"lease_id"`, `"Lease_id"`, 1),
		strings.Replace(s, `"lease_id":"lease_1"`, `"lease_id":"lease_1","lease_id":"lease_2"`, 1),
		strings.Replace(s, `"status":"success"`, `"status":"success","extra":1`, 1),
		"\xff" + s, `"text"`, "null",
	} {
		var got, want wire.Success
		gerr, werr := decodeStrict([]byte(body), &got), lease.DecodeStrict([]byte(body), &want)
		if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Errorf("%q: error %v, lease.DecodeStrict's %v", body, gerr, werr)
		}
		if gerr == nil {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			if string(g) != string(w) {
				t.Errorf("%q: decoded %s, lease.DecodeStrict %s", body, g, w)
			}
		}
	}
	for _, body := range []string{string(bad), strings.Replace(string(bad), `"msg"`, `"MSG"`, 1)} {
		var got, want wire.Error
		gerr, werr := decodeStrict([]byte(body), &got), lease.DecodeStrict([]byte(body), &want)
		if (gerr == nil) != (werr == nil) {
			t.Errorf("%q: error %v, lease.DecodeStrict's %v", body, gerr, werr)
		}
	}
}

// Concurrent calls through a default client reuse their connections:
// net/http's default keeps 2 idle connections per host, so after each
// round of concurrent calls it would close all but two and dial again.
func TestDefaultClientReusesConnections(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Correlation-ID", "corr_1")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"status":"error","code":"lease_conflict","msg":"m","correlation_id":"corr_1","retryable":true,"retry_after_ms":250}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := New(srv.URL, "star_sk_v1_key")
	if err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 16, 10
	for range rounds {
		// All callers in flight at once, then all idle at once.
		var wg, ready sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			ready.Add(1)
			go func() {
				defer wg.Done()
				ready.Done()
				<-start
				c.Inspect(context.Background(), lease.Identity{TenantID: "t"})
			}()
		}
		ready.Wait()
		close(start)
		wg.Wait()
	}
	// A caller may now and then find a connection not yet back in the
	// pool and dial another; churn would be about callers-2 per round.
	if n := conns.Load(); n > 2*callers {
		t.Fatalf("%d connections for %d rounds of %d concurrent calls", n, rounds, callers)
	}
}
