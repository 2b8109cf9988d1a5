package service

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/audit/audittest"
	"github.com/starintel/starlease/lease"
)

// checkingSink is a Recorder whose Check reports err.
type checkingSink struct {
	audittest.Recorder
	err error
}

func (c *checkingSink) Check(context.Context) error { return c.err }

// Health is degraded while the sink cannot write durably, and while the
// queryable audit store is behind the durable file, each said as it is.
func TestHealthNamesWhichAuditFault(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("audit.jsonl: write: %w", syscall.ENOSPC), "durable audit unavailable: audit.jsonl: write: no space left on device"},
		{fmt.Errorf("%w: 3 events wait: %w", audit.ErrIndexBehind, syscall.ENOSPC), "the audit store is behind the audit file: 3 events wait: no space left on device"},
	} {
		s, _ := newService(t, &checkingSink{err: c.err}, Config{})
		h := s.Health(ctx)
		if h.Status != lease.HealthDegraded || h.Reason != c.want {
			t.Errorf("health with %v: %s %q, want degraded %q", c.err, h.Status, h.Reason, c.want)
		}
		if strings.Contains(h.Reason, "durable audit unavailable") == (c.err != nil && strings.Contains(c.err.Error(), "behind")) {
			t.Errorf("health %q: durable audit is unavailable only when the file fails", h.Reason)
		}
	}
}
