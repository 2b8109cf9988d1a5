package main

import (
	"encoding/json"
	"os"
	"runtime"
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

func TestTuneProcsAddsSparePsUnlessGOMAXPROCSIsSet(t *testing.T) {
	prev := runtime.GOMAXPROCS(3)
	defer runtime.GOMAXPROCS(prev)

	for _, c := range []struct{ cpus, want int }{{1, 2}, {3, 6}, {4, 8}, {16, 20}} {
		runtime.GOMAXPROCS(c.cpus) // as the runtime found them
		if n, from := tuneProcs(func(string) (string, bool) { return "", false }); n != c.want || from != "default" {
			t.Fatalf("tuneProcs over %d Ps without GOMAXPROCS says %d from %q, want %d from default", c.cpus, n, from, c.want)
		}
		if inEffect := runtime.GOMAXPROCS(0); inEffect != c.want {
			t.Fatalf("GOMAXPROCS after tuneProcs over %d is %d, want %d", c.cpus, inEffect, c.want)
		}
	}
	runtime.GOMAXPROCS(5) // as the runtime set it from GOMAXPROCS=5
	if n, from := tuneProcs(func(k string) (string, bool) { return "5", k == "GOMAXPROCS" }); n != 5 || from != "GOMAXPROCS" {
		t.Fatalf("tuneProcs with GOMAXPROCS=5 says %d from %q", n, from)
	}
	if inEffect := runtime.GOMAXPROCS(0); inEffect != 5 {
		t.Fatalf("tuneProcs changed the GOMAXPROCS the environment set: %d", inEffect)
	}
}

// TestServeLogsItsRuntimeTargets runs the real server and reads the GC
// target and Ps it logged once its store was open.
func TestServeLogsItsRuntimeTargets(t *testing.T) {
	srv := testenv.StartStarlease(t, starleaseBin(t))
	for _, line := range strings.Split(string(srv.Stderr()), "\n") {
		var e struct {
			Msg       string `json:"msg"`
			GCPercent int    `json:"gc_percent"`
			GCFrom    string `json:"gc_from"`
			Procs     int    `json:"gomaxprocs"`
			ProcsFrom string `json:"gomaxprocs_from"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Msg != "runtime" {
			continue
		}
		if _, set := os.LookupEnv("GOGC"); !set && (e.GCPercent != serveGCPercent || e.GCFrom != "default") {
			t.Errorf("serve logged gc_percent %d from %q, want %d from default: %s", e.GCPercent, e.GCFrom, serveGCPercent, line)
		}
		if _, set := os.LookupEnv("GOMAXPROCS"); !set && (e.Procs < 2 || e.ProcsFrom != "default") {
			t.Errorf("serve logged gomaxprocs %d from %q, want at least 2 from default: %s", e.Procs, e.ProcsFrom, line)
		}
		return
	}
	t.Fatalf("serve logged no runtime line; stderr:\n%s", srv.Stderr())
}
