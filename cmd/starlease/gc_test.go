package main

import (
	"encoding/json"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
)

func TestTuneGCSetsServeTargetUnlessGOGCIsSet(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)

	if got := tuneGC(func(string) (string, bool) { return "", false }); got != "400" {
		t.Fatalf("tuneGC without GOGC says %q, want 400", got)
	}
	if inEffect := debug.SetGCPercent(100); inEffect != serveGCPercent {
		t.Fatalf("GC percent after tuneGC without GOGC is %d, want %d", inEffect, serveGCPercent)
	}

	// GOGC set: the runtime applied it at start; tuneGC leaves it alone.
	debug.SetGCPercent(150)
	if got := tuneGC(func(k string) (string, bool) { return "150", k == "GOGC" }); got != "GOGC=150" {
		t.Fatalf("tuneGC with GOGC=150 says %q", got)
	}
	if inEffect := debug.SetGCPercent(100); inEffect != 150 {
		t.Fatalf("tuneGC changed the GC percent GOGC set: %d, want 150", inEffect)
	}
}

// TestServeLogsItsGCTarget runs the real server and reads the target it
// logged at start.
func TestServeLogsItsGCTarget(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBin(t))
	want := "400"
	if v, ok := os.LookupEnv("GOGC"); ok { // the server inherits it
		want = "GOGC=" + v
	}
	for _, line := range strings.Split(string(srv.Stderr()), "\n") {
		var e struct {
			Msg  string `json:"msg"`
			GOGC string `json:"gogc"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "garbage collector" {
			if e.GOGC != want {
				t.Fatalf("serve logged gogc %q, want %q", e.GOGC, want)
			}
			return
		}
	}
	t.Fatalf("serve logged no garbage collector line; stderr:\n%s", srv.Stderr())
}
