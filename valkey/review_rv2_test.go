package valkey

// Review of namespace format 3 (record version 2, commit b053f20): tests
// written by a reviewer who did not write the change. Tests named
// TestReviewRV2... expose a defect (they fail on b053f20); the others
// assert behaviour that held.

import (
	"bytes"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// rv2Line indexes of a stored version 2 record (lines split on '\n').
const (
	rv2LineOwnerCredential = 12
	rv2LineRequestID       = 23
)

// damageActive replaces line i of the identity's stored record (which
// must be version 2) by v, keeping its TTL, and returns the new bytes.
func damageActiveLine(t *testing.T, s *Store, rec *lease.Record, i int, v string) string {
	t.Helper()
	key := s.keys.active(tagOf(rec.LockKey))
	raw, ok := get(t, s, key)
	if !ok || !strings.HasPrefix(raw, lease.RecordV2Prefix) {
		t.Fatalf("no version 2 record: %.30q", raw)
	}
	lines := strings.Split(raw, "\n")
	lines[i] = v
	bad := strings.Join(lines, "\n")
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(bad).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return bad
}

// damageActiveV1 replaces old by new in the identity's stored version 1
// record, keeping its TTL.
func damageActiveV1(t *testing.T, s *Store, rec *lease.Record, old, new string) string {
	t.Helper()
	key := s.keys.active(tagOf(rec.LockKey))
	raw, ok := get(t, s, key)
	if !ok || !strings.HasPrefix(raw, `{"record_version":1,`) || !strings.Contains(raw, old) {
		t.Fatalf("no version 1 record holding %q: %.60q", old, raw)
	}
	bad := strings.Replace(raw, old, new, 1)
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(bad).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return bad
}

// A stored record whose opaque ids break lease.CheckOpaqueID (".." or an
// API-key prefix) is corrupt for Go (DecodeStoredRecord, Inspect), so the
// fenced-write boundary must not authorize a commit on it and a renewal
// must not write before Go reports it corrupt. The library's is_id admits
// both, in version 2 and in version 1 alike: AuthorizeCommit succeeds (it
// never decodes the record in Go) and Renew rewrites the record, then
// answers corrupt.
func TestReviewRV2LibraryActsOnRecordGoRefuses(t *testing.T) {
	for _, records := range []bool{true, false} {
		for _, dmg := range []struct {
			name string
			line int
			v    func(r *lease.Record) string
			old  func(r *lease.Record) string
		}{
			{"request_id_dotdot", rv2LineRequestID, func(r *lease.Record) string { return r.RequestID + "..x" },
				func(r *lease.Record) string { return r.RequestID }},
			{"credential_api_key", rv2LineOwnerCredential, func(r *lease.Record) string { return "star_sk_x" },
				func(r *lease.Record) string { return r.OwnerCredentialID }},
		} {
			name := map[bool]string{true: "rv2_", false: "v1_"}[records] + dmg.name
			t.Run(name, func(t *testing.T) {
				s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: records})
				a, err := s.Acquire(bg, acquireReq(newIdentity()))
				if err != nil {
					t.Fatal(err)
				}
				var bad string
				if records {
					bad = damageActiveLine(t, s, a.Lease, dmg.line, dmg.v(a.Lease))
				} else {
					bad = damageActiveV1(t, s, a.Lease, `"`+dmg.old(a.Lease)+`"`, `"`+dmg.v(a.Lease)+`"`)
				}
				if _, err := lease.DecodeStoredRecord([]byte(bad)); lease.CodeOf(err) != lease.CodeCorrupt {
					t.Fatalf("Go decodes the damaged record: %v", err)
				}
				_, err = s.Inspect(bg, lease.InspectRequest{Identity: a.Lease.Identity(), DeadlineAt: far()})
				mustCode(t, err, lease.CodeCorrupt)
				// The fenced-write boundary on a record Go calls corrupt.
				if _, err := s.AuthorizeCommit(bg, commitReq(a.Lease)); lease.CodeOf(err) != lease.CodeCorrupt {
					t.Errorf("AuthorizeCommit on a record Go refuses as corrupt: %v, want corrupt", err)
				}
				// A renewal must change nothing before it is refused.
				_, err = s.Renew(bg, renewReq(a.Lease))
				after, _ := get(t, s, s.keys.active(tagOf(a.Lease.LockKey)))
				if lease.CodeOf(err) != lease.CodeCorrupt || after != bad {
					t.Errorf("Renew on a record Go refuses: %v, stored record changed: %v", err, after != bad)
				}
			})
		}
	}
}

// An acquisition over an expired record that Go refuses as corrupt must
// fail closed ("no acquisition over ambiguity"); the library archives it
// and grants a new lease (version 2 and version 1 alike).
func TestReviewRV2AcquireOverExpiredRecordGoRefuses(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	a, err := s.Acquire(bg, acquireReq(newIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, releaseReq(a.Lease)); err != nil {
		t.Fatal(err)
	}
	exp := putExpired(t, faults{s}, a.Lease)
	v2, err := lease.CompactRecord(exp)
	if err != nil || !strings.HasPrefix(string(v2), lease.RecordV2Prefix) {
		t.Fatalf("%v %.20q", err, v2)
	}
	key := s.keys.active(tagOf(exp.LockKey))
	if err := s.client.Do(bg, s.client.B().Set().Key(key).Value(string(v2)).Keepttl().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	bad := damageActiveLine(t, s, exp, rv2LineRequestID, exp.RequestID+"..x")
	if _, err := lease.DecodeStoredRecord([]byte(bad)); lease.CodeOf(err) != lease.CodeCorrupt {
		t.Fatalf("Go decodes the damaged record: %v", err)
	}
	_, err = s.Acquire(bg, acquireReq(exp.Identity()))
	if lease.CodeOf(err) != lease.CodeCorrupt {
		t.Errorf("acquire over an expired record Go refuses as corrupt: %v, want corrupt", err)
	}
}

// The recovery tools open the namespace with the backend flags, so an
// operator who passes the server's --valkey-compact-records to `starlease
// restore` opens the (empty) target with CompactRecords: Open writes the
// format switch into it first, and the restore then refuses the target as
// not empty (it holds <prefix>:format). The same holds for
// --valkey-compact-format (before this change too).
func TestReviewRV2RestoreWithCompactRecordsOption(t *testing.T) {
	r := sharedServer(t)
	src := open(t, r, Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	if _, err := src.Acquire(bg, acquireReq(newIdentity())); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if _, err := src.Backup(bg, &backup); err != nil {
		t.Fatal(err)
	}
	n := NewNamespace(Options{Addr: r.Addr(), KeyPrefix: randomPrefix(), StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	defer n.Close()
	if _, err := n.Restore(bg, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatalf("restore of a format 3 backup by a tool opened with CompactRecords: %v", err)
	}
}

// A closed namespace (sealed after a failover, restored, or paused by a
// backup) must not change until recovery or the backup reopens it (the
// gate: "nothing may change"). raise_format does not look at the gate, so
// an instance or a recovery tool opened with CompactRecords switches a
// closed namespace's format. (Low impact: no record is rewritten while
// closed; shown for the gate's promise.)
func TestReviewRV2RaiseFormatIgnoresGate(t *testing.T) {
	_, o, s := sealedCompactNamespace(t)
	o.CompactRecords = true
	c, err := NewNamespace(o).OpenClosed(bg)
	if err == nil {
		defer c.Close()
	}
	if v, _ := get(t, s, s.keys.format()); v != compactFormat {
		t.Fatalf("the switch of a sealed namespace changed to %q (OpenClosed: %v)", v, err)
	}
}
