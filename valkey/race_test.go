package valkey

import (
	"testing"
	"time"

	"github.com/starintel/starlease/lease/leasetest"
	"github.com/starintel/starlease/lease/leasetest/race"
)

// TestRace runs the race suite with a linearizability check against a real
// server (the documented ACL user), with the reaper running as a
// concurrent actor.
func TestRace(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond})
	race.Run(t, s, race.Options{})
}

// TestRaceReferringEvidence runs it on a namespace in format 5.
func TestRaceReferringEvidence(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond, ReferringEvidence: true})
	if !s.writes(referringEvidence) {
		t.Fatal("the namespace is not in format 5")
	}
	race.Run(t, s, race.Options{})
}

// TestRaceLeanRecords runs it on a namespace in format 6.
func TestRaceLeanRecords(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond, LeanRecords: true})
	if !s.writes(leanRecords) {
		t.Fatal("the namespace is not in format 6")
	}
	race.Run(t, s, race.Options{})
}

// TestRaceLeanEvidence runs it on a namespace in format 7.
func TestRaceLeanEvidence(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond, LeanEvidence: true})
	if !s.writes(leanEvidence) {
		t.Fatal("the namespace is not in format 7")
	}
	race.Run(t, s, race.Options{})
}

// TestRaceCheckedEvidence runs it on a namespace in format 8.
func TestRaceCheckedEvidence(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond, CheckedEvidence: true})
	if !s.writes(checkedEvidence) {
		t.Fatal("the namespace is not in format 8")
	}
	race.Run(t, s, race.Options{})
}

// TestRaceEmbeddedEvidence runs it on a namespace in format 4.
func TestRaceEmbeddedEvidence(t *testing.T) {
	r, pw := aclServer(t)
	s := open(t, r, Options{Username: "starlease", PasswordFile: pw, KeyPrefix: "starlease:" + randomPrefix(),
		StoreOptions: leasetest.StoreOptions(), ReapInterval: 50 * time.Millisecond, EmbeddedEvidence: true})
	if !s.writes(embeddedEvidence) {
		t.Fatal("the namespace is not in format 4")
	}
	race.Run(t, s, race.Options{})
}
