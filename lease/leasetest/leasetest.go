// Package leasetest is the backend-neutral conformance suite of the lease-store
// protocol. Every backend's tests call Run, the way testing/fstest.TestFS is
// called for file systems. Subtests are named after the rows of the contract's
// race/failure table and the items of its "MUST collectively prove" list.
package leasetest

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// OperationClasses are the operation classes a backend under test must be
// configured with (see StoreOptions).
var OperationClasses = []string{"default", "scrape", "enrich"}

// StoreOptions returns the options a backend under test must be opened
// with: the suite's operation classes and small page and history bounds so
// pagination and retention are exercised.
func StoreOptions() lease.StoreOptions {
	classes, err := lease.NewOperationClasses(OperationClasses...)
	if err != nil {
		panic(err)
	}
	return lease.StoreOptions{
		OperationClasses:   classes,
		MaxPageSize:        50,
		HistoryPerIdentity: 8,
	}
}

// Faults reaches into a backend to create states no client request can.
type Faults interface {
	// Counter reads the durable fencing counter of lockKey (0 if none).
	Counter(ctx context.Context, lockKey string) (uint64, error)
	// SetCounter sets the durable fencing counter of lockKey.
	SetCounter(ctx context.Context, lockKey string, value uint64) error
	// PutRawActive stores raw bytes as the active record of lockKey,
	// bypassing every check, as corruption or a foreign writer would.
	PutRawActive(ctx context.Context, lockKey string, raw []byte) error
	// ExpireIfCurrent runs the backend's own delayed expiry cleanup for one
	// lease: it must act only if the active record still has this lease id
	// and token and is expired at backend time.
	ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error
}

// Backend is a store under test and its fault hooks.
type Backend struct {
	Store  lease.Store
	Faults Faults
}

// Factory opens a fresh, empty backend configured with StoreOptions. It
// registers its own cleanup with t.Cleanup.
type Factory func(t *testing.T) Backend

// Short is the TTL the suite uses where it waits for expiry; long enough for
// a loaded CI machine to finish the steps before it, short enough to keep the
// suite fast.
const Short = 400 * time.Millisecond
