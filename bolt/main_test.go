package bolt

import (
	"os"
	"testing"
)

// The tests of this package read and damage the store file directly, so
// a store they open takes each batch into the file before answering it
// (FlushInterval -1) unless it asks otherwise: the suites that use the
// store only through its API (conformance, race), the engine's own tests
// and the kill -9 child run with a positive interval.
func TestMain(m *testing.M) {
	zeroFlushInterval = -1
	os.Exit(m.Run())
}
