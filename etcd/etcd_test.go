package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

func randomPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "t" + hex.EncodeToString(b[:])
}

// testLogger sends the store's alerts to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// open opens a store on c with a fresh random prefix, closed in cleanup.
func open(t testing.TB, c *testenv.EtcdCluster, o Options) *Store {
	t.Helper()
	if o.KeyPrefix == "" {
		o.KeyPrefix = randomPrefix()
	}
	if o.Endpoints == nil && o.Client == nil {
		o.Endpoints = c.Endpoints()
	}
	if o.StoreOptions.Logger == nil {
		o.StoreOptions.Logger = testLogger(t)
	}
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("etcd.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// faults reaches into etcd directly to create states no client request can.
type faults struct{ s *Store }

func (f faults) Counter(ctx context.Context, lockKey string) (uint64, error) {
	v, err := f.s.getOne(ctx, f.s.keys.counter(lockKey))
	if err != nil {
		return 0, err
	}
	n, _ := readU64(v)
	return n, nil
}

func (f faults) SetCounter(ctx context.Context, lockKey string, value uint64) error {
	_, err := f.s.cli.Put(ctx, f.s.keys.counter(lockKey), string(u64(value)))
	return err
}

func (f faults) PutRawActive(ctx context.Context, lockKey string, raw []byte) error {
	_, err := f.s.cli.Put(ctx, f.s.keys.active(lockKey), string(raw))
	return err
}

func (f faults) ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return f.s.expireIfCurrent(ctx, lockKey, leaseID, token)
}

var _ = lease.Store(nil)

// SetOutboxBounds sets a fresh store's outbox bounds before its first use.
func (f faults) SetOutboxBounds(maxPending, maxBytes int64) {
	f.s.opts.OutboxMaxPending, f.s.opts.OutboxMaxBytes = maxPending, maxBytes
}
