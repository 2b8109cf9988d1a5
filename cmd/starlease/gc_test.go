package main

import (
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
)

func TestTuneGCSetsServeTargetUnlessGOGCIsSet(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)

	if p, from := tuneGC(func(string) (string, bool) { return "", false }); p != serveGCPercent || from != "default" {
		t.Fatalf("tuneGC without GOGC says %d from %q, want %d from default", p, from, serveGCPercent)
	}
	if inEffect := debug.SetGCPercent(100); inEffect != serveGCPercent {
		t.Fatalf("GC percent after tuneGC without GOGC is %d, want %d", inEffect, serveGCPercent)
	}

	// GOGC set: the runtime applied it at start (or, malformed, kept 100);
	// tuneGC leaves it alone and reports what is in effect.
	for _, c := range []struct {
		env     string
		applied int
	}{{"150", 150}, {"abc", 100}, {"off", -1}} {
		debug.SetGCPercent(c.applied)
		if p, from := tuneGC(func(k string) (string, bool) { return c.env, k == "GOGC" }); p != c.applied || from != "GOGC" {
			t.Fatalf("tuneGC with GOGC=%s says %d from %q, want %d from GOGC", c.env, p, from, c.applied)
		}
		if inEffect := debug.SetGCPercent(100); inEffect != c.applied {
			t.Fatalf("tuneGC changed the GC percent GOGC=%s set: %d, want %d", c.env, inEffect, c.applied)
		}
	}
}

// TestServeLogsItsGCTarget runs the real server and reads the target it
// logged once its store was open.
func TestServeLogsItsGCTarget(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBin(t))
	want := `"gc_percent":400,"from":"default"`
	if _, ok := os.LookupEnv("GOGC"); ok { // the server inherits it
		want = `"from":"GOGC"`
	}
	for _, line := range strings.Split(string(srv.Stderr()), "\n") {
		if strings.Contains(line, `"msg":"garbage collector"`) {
			if !strings.Contains(line, want) {
				t.Fatalf("serve logged %s, want %s in it", line, want)
			}
			return
		}
	}
	t.Fatalf("serve logged no garbage collector line; stderr:\n%s", srv.Stderr())
}
