package valkey

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// faults reaches into Valkey directly to create states no client request
// can. It uses the store's own key layout and cleanup function.
type faults struct{ s *Store }

func (f faults) raw() vk.Client { return f.s.client }

func (f faults) Counter(ctx context.Context, lockKey string) (uint64, error) {
	v, err := f.raw().Do(ctx, f.raw().B().Get().Key(f.s.keys.counter(tagOf(lockKey))).Build()).ToString()
	if vk.IsValkeyNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v, 10, 64)
}

func (f faults) SetCounter(ctx context.Context, lockKey string, value uint64) error {
	return f.raw().Do(ctx, f.raw().B().Set().Key(f.s.keys.counter(tagOf(lockKey))).Value(utoa(value)).Build()).Error()
}

// PutRawActive stores raw as the active record with a TTL as the adapter
// sets one: past expires_at by the reclaim grace if raw is a record, else
// the reclaim grace from now.
func (f faults) PutRawActive(ctx context.Context, lockKey string, raw []byte) error {
	c := f.raw()
	key := f.s.keys.active(tagOf(lockKey))
	if rec, err := lease.DecodeRecord(raw); err == nil {
		at := rec.ExpiresAt.Time().Add(f.s.reclaimGrace).UnixMilli()
		return c.Do(ctx, c.B().Set().Key(key).Value(string(raw)).PxatMillisecondsTimestamp(at).Build()).Error()
	}
	return c.Do(ctx, c.B().Set().Key(key).Value(string(raw)).Px(f.s.reclaimGrace).Build()).Error()
}

func (f faults) ExpireIfCurrent(ctx context.Context, lockKey, leaseID string, token uint64) error {
	return f.s.expireIfCurrent(ctx, lockKey, leaseID, token)
}

// testLogger sends the store's alerts to the test log, shown on failure
// or with -v, instead of standard error.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func randomPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "t" + hex.EncodeToString(b[:])
}

// open opens a store on r with a fresh random namespace, so it starts empty.
func open(t testing.TB, r *testenv.Redis, o Options) *Store {
	t.Helper()
	if o.Addr == "" {
		o.Addr = r.Addr()
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = randomPrefix()
	}
	if o.ReapInterval == 0 {
		o.ReapInterval = -1
	}
	if o.StoreOptions.Logger == nil {
		o.StoreOptions.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// SetOutboxBounds sets a fresh store's outbox bounds (leasetest.OutboxBounder).
func (f faults) SetOutboxBounds(maxPending, maxBytes int64) {
	f.s.opts.OutboxMaxPending, f.s.opts.OutboxMaxBytes = maxPending, maxBytes
}
