package etcd

import (
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
