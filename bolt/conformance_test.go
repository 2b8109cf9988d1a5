package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease/leasetest"
)

func TestConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1, FlushInterval: DefaultFlushInterval})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestLogScreening: a store a library caller opens with its own logger
// screens the 64-hex target id its ALERTs name.
func TestLogScreening(t *testing.T) {
	leasetest.LogScreening(t, func(t *testing.T, log *slog.Logger) leasetest.Backend {
		o := leasetest.StoreOptions()
		o.Logger = log
		s := openTemp(t, Options{StoreOptions: o, ReapInterval: -1})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// Restoring through a namespace a library caller opened with its own
// logger writes the restore's line to that logger, screened (the backup's
// SHA-256 is 64 hex digits), and nothing to slog's default.
func TestRestoreLogsToTheCallersLoggerScreened(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTemp(t, Options{ReapInterval: -1})
	if _, err := s.Acquire(ctx, acquireReq("req-1", time.Minute, time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	h, err := s.Backup(ctx, &backup)
	if err != nil {
		t.Fatal(err)
	}
	var mine, def testenv.Buffer
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	slog.SetDefault(slog.New(slog.NewJSONHandler(&def, nil)))
	o := leasetest.StoreOptions()
	o.Logger = slog.New(slog.NewJSONHandler(&mine, nil))
	if _, err := NewNamespace(filepath.Join(dir, "restored.db"), Options{StoreOptions: o}).Restore(ctx, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if def.String() != "" {
		t.Fatalf("restore wrote to slog's default, not the caller's logger: %s", def.String())
	}
	var line map[string]any
	if err := json.Unmarshal(mine.Bytes(), &line); err != nil {
		t.Fatalf("%v: %q", err, mine.String())
	}
	if !strings.HasPrefix(fmt.Sprint(line["msg"]), "lease store restored") || line["backup_sha256"] != audit.Redacted ||
		strings.Contains(mine.String(), h.PayloadSHA256) {
		t.Fatalf("restore's line %v, want it with backup_sha256 %q", line, audit.Redacted)
	}
}
