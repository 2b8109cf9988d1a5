package bolt

import (
	"log/slog"
	"testing"

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
