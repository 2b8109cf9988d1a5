//go:build linux

// Package scenario holds end-to-end scenario tests of StarIntel target
// leases with real actor processes and real servers (redis-server as the
// Valkey lease backend, pouchdb-server as CouchDB, rabbitmq-server). It has
// no code of its own: the actor is the test binary re-executed (TestMain).
package scenario

import (
	"os"
	"testing"
)

// TestMain runs the actor instead of the tests when the binary was started
// as one (actorEnv=1).
func TestMain(m *testing.M) {
	if os.Getenv(actorEnv) == "1" {
		os.Exit(actorMain())
	}
	os.Exit(m.Run())
}
