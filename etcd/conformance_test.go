package etcd

import (
	"log/slog"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease/leasetest"
)

// TestConformance runs the backend-neutral conformance suite against a real
// three-member cluster: every backend is a fresh prefix on it.
func TestConformance(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		// No background reaper: subtests compare snapshots before and after
		// a refused operation, and drive expiry cleanup themselves.
		s := open(t, c, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestLogScreening: a store a library caller opens with its own logger
// screens the 64-hex target id its ALERTs name.
func TestLogScreening(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 1)
	leasetest.LogScreening(t, func(t *testing.T, log *slog.Logger) leasetest.Backend {
		o := leasetest.StoreOptions()
		o.Logger = log
		s := open(t, c, Options{StoreOptions: o, ReapInterval: -1})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}
