package valkey

import (
	"log/slog"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
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

// TestConformanceCompactRecords runs the suite again on namespaces switched
// to format 3 (format.go): evidence, history and active records stored in
// version 2, read and written by the library's version 2 paths.
func TestConformanceCompactRecords(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
		if !s.writes(compactRecords) {
			t.Fatal("the namespace is not in format 3")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceReferringEvidence runs the suite on namespaces switched to
// format 5: an ending's acquisition evidence and a release's own by
// reference to the history entry.
func TestConformanceReferringEvidence(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), ReferringEvidence: true})
		if !s.writes(referringEvidence) {
			t.Fatal("the namespace is not in format 5")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceLeanRecords runs the suite on namespaces switched to
// format 6: format 5's, active records in version 4.
func TestConformanceLeanRecords(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), LeanRecords: true})
		if !s.writes(leanRecords) {
			t.Fatal("the namespace is not in format 6")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceLeanEvidence runs the suite on namespaces switched to
// format 7: format 6's, evidence by reference in version 5.
func TestConformanceLeanEvidence(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), LeanEvidence: true})
		if s.writeFormat() != "lean_evidence" {
			t.Fatal("the namespace is not in format 7")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceCheckedEvidence runs the suite on namespaces switched to
// format 8 (evidence written whole in version 6) whose stores detach
// eagerly, so that endings on an identity at its history cap write
// version 6 too.
func TestConformanceCheckedEvidence(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), CheckedEvidence: true, EagerDetach: true})
		if s.writeFormat() != "checked_evidence+eager" {
			t.Fatal("the namespace is not in format 8")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceEagerDetach runs the suite on format 6 namespaces whose
// stores detach eagerly (Options.EagerDetach).
func TestConformanceEagerDetach(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), LeanRecords: true, EagerDetach: true})
		if s.writeFormat() != "lean_records+eager" {
			t.Fatal("the store does not detach eagerly in format 6")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestConformanceEmbeddedEvidence runs the suite on namespaces switched to
// format 4: acquisition evidence in version 3 records until a lease ends.
func TestConformanceEmbeddedEvidence(t *testing.T) {
	r, pw := aclServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Backend {
		s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
			StoreOptions: leasetest.StoreOptions(), EmbeddedEvidence: true})
		if !s.writes(embeddedEvidence) {
			t.Fatal("the namespace is not in format 4")
		}
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}

// TestLogScreening: a store a library caller opens with its own logger
// screens the 64-hex target id its ALERTs name (format 6; the ALERTs are
// the Go side's in every format).
func TestLogScreening(t *testing.T) {
	r := testenv.StartRedis(t)
	leasetest.LogScreening(t, func(t *testing.T, log *slog.Logger) leasetest.Backend {
		o := leasetest.StoreOptions()
		o.Logger = log
		s := open(t, r, Options{StoreOptions: o, LeanRecords: true})
		return leasetest.Backend{Store: s, Faults: faults{s}}
	})
}
