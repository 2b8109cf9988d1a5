package valkey

import (
	"testing"

	"github.com/starintel/starlease/lease/leasetest"
)

// TestConformance runs the backend-neutral conformance suite against a real
// server, as the documented least-privilege ACL user with its password
// read from a file: every backend is a fresh namespace on one server.
func TestConformance(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions()})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}
