package bolt

import (
	"testing"

	"github.com/starintel/starlease/lease/leasetest"
)

func TestConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), ReapInterval: -1, FlushInterval: DefaultFlushInterval})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}
