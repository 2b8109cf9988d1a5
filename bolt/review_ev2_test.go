package bolt

// Review of the ev2 change (schema 4, lease.CompactEvidence). Each test
// tries to break one promise of the change; see the report.

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// schema3File writes, at path, the file a schema 3 build leaves: version 1
// evidence, meta schema "3". It returns the lease life written into it.
func schema3File(t *testing.T, path string, c *clock, far time.Time) leaseLife {
	t.Helper()
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	l := live(t, s, c, "schema3-backup", far)
	v1s := map[string]string{}
	for _, lk := range l.lookups(far) {
		k, v, p := evidenceOf(t, s, lk)
		v1, ok := lease.ExpandEvidence(string(v), p.Identity)
		if !ok {
			t.Fatal("evidence does not expand")
		}
		v1s[string(k)] = v1
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for k, v := range v1s {
			if err := tx.Bucket(bucketIdent).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return asSchema(tx, schemaVersionV3)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return l
}

// ATTACK: restore a backup taken by the previous (schema 3) build. A
// schema 3 build's Backup is tx.WriteTo of its file in a backupfile
// envelope; this builds exactly that envelope around a schema 3 file. The
// README promises "a backup of any schema restores", and the commit says
// schema 3 files open as schema 4: the restore must succeed and the
// restored namespace must answer lookups of pre-backup request ids.
func TestReviewEv2RestoreOfSchema3Backup(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	src := filepath.Join(dir, "old.db")
	l := schema3File(t, src, c, far)

	file, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := backupfile.Write(&buf, backupfile.Header{Backend: BackendName, CreatedAt: c.Now().UTC(),
		Counts: map[string]int64{"counters": 1}}, func(w io.Writer) error { _, err := io.Copy(w, bytes.NewReader(file)); return err }); err != nil {
		t.Fatal(err)
	}

	target := filepath.Join(dir, "restored.db")
	o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
	if _, err := NewNamespace(target, o).Restore(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("restore of a schema 3 backup (taken by the previous build): %v", err)
	}
	s, err := Open(target, o)
	if err != nil {
		t.Fatalf("open restored schema 3 backup: %v", err)
	}
	defer s.Close()
	l.lookupsAnswer(t, s, far)
}

// ATTACK: caller-chosen metadata (newlines, CR, NUL, U+2028/2029, a fake
// "ev2" document, JSON fragments, backslashes, HTML characters) and a
// non-ASCII identity, through acquire, renew, release, force-release and
// revoke, with history trimmed to one entry so replays run after the
// lease's terminal evidence is gone. Every replay and lookup must answer
// exactly the original result, and a retry with other metadata must
// conflict. (Regression test: the attack did not break the code.)
func TestReviewEv2HostileMetadataReplaysExactly(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity = 1
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	fake := "ev2\nacquire\n" + strings.Repeat("ab", 16) + "\nacquired\n1\ntag\nlease_X\nprn-evil\n"
	metas := map[string]lease.Metadata{
		"newlines": {"note": "a\nb\nc\n"},
		"cr-nul":   {"note": "x\ry\x00z"},
		"ls-ps":    {"note": "\u2028\u2029"},
		"fake-ev2": {"note": fake, "k2": "\n" + fake},
		"json":     {"note": `","state":"active","fencing_token":99,"x":"`, "brace": "}\n{\"a\":1}"},
		"bs-html":  {"note": `\\"\u003c<&>`, "n": 1.5e300, "t": true, "z": nil},
		"unicode":  {"ключ": "значение", "é": "é"},
		"empty":    nil,
	}
	n := 0
	for name, m := range metas {
		n++
		target := "ziel-é-" + name
		req := acquireReq("acq-"+name, time.Minute, far)
		req.Identity.TargetID = target
		req.TraceID = "Trace-" + name
		req.Metadata = m
		acq, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("%s: acquire: %v", name, err)
		}
		lk := lease.LookupRequest{Op: lease.OpAcquire, Identity: req.Identity, PrincipalID: req.Caller.PrincipalID, RequestID: req.RequestID, DeadlineAt: far}
		_, v, _ := evidenceOf(t, s, lk)
		t.Logf("%s: acquire evidence stored as %s (%d bytes)", name, map[bool]string{true: "ev2", false: "v1"}[bytes.HasPrefix(v, []byte("ev2\n"))], len(v))
		c.Add(time.Second)
		r := acq.Lease
		ren := lease.RenewRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, TTL: 2 * time.Minute,
			ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "ren-" + name, DeadlineAt: far, Caller: callerOfRecord(r)}}
		renRes, err := s.Renew(ctx, ren)
		if err != nil {
			t.Fatal(err)
		}
		c.Add(time.Second)
		op := lease.OpForceRelease
		end := s.ForceRelease
		if n%2 == 0 {
			op, end = lease.OpRevoke, s.Revoke
		}
		adm := lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, Reason: "line one, \"two\"",
			IncidentID: "inc-" + name, Mutation: lease.Mutation{RequestID: "adm-" + name, DeadlineAt: far,
				Caller: lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}}}
		admRes, err := end(ctx, adm)
		if err != nil {
			t.Fatalf("%s: %s: %v", name, op, err)
		}
		c.Add(time.Second)
		// A second lease of the identity pushes the first out of history
		// (HistoryPerIdentity 1) once it ends too.
		req2 := req
		req2.RequestID = "acq2-" + name
		a2, err := s.Acquire(ctx, req2)
		if err != nil {
			t.Fatal(err)
		}
		rel2 := lease.ReleaseRequest{Identity: a2.Lease.Identity(), LeaseID: a2.Lease.LeaseID, FencingToken: a2.Lease.FencingToken,
			ServiceInstanceID: a2.Lease.ServiceInstanceID, Mutation: lease.Mutation{RequestID: "rel2-" + name, DeadlineAt: far, Caller: callerOfRecord(a2.Lease)}}
		if _, err := s.Release(ctx, rel2); err != nil {
			t.Fatal(err)
		}
		c.Add(time.Second)

		check := func(what string, got lease.Result, err error, want lease.Result) {
			t.Helper()
			if err != nil || got.Code != want.Code || encoded(t, got.Lease) != encoded(t, want.Lease) || got.BackendTime != want.BackendTime {
				t.Fatalf("%s: %s: %v %+v, want %+v", name, what, err, got.Lease, want.Lease)
			}
		}
		got, err := s.Acquire(ctx, req)
		check("acquire replay", got, err, acq)
		if got.Current == nil || got.Current.State != lease.StateExpired {
			t.Fatalf("%s: acquire replay after history trim: current %+v", name, got.Current)
		}
		got, err = s.Renew(ctx, ren)
		check("renew replay", got, err, renRes)
		got, err = end(ctx, adm)
		check(string(op)+" replay", got, err, admRes)
		for _, x := range []struct {
			op   lease.Op
			id   lease.Identity
			prn  string
			rid  string
			want lease.Result
		}{{lease.OpAcquire, req.Identity, req.Caller.PrincipalID, req.RequestID, acq},
			{lease.OpRenew, ren.Identity, ren.Caller.PrincipalID, ren.RequestID, renRes},
			{op, adm.Identity, adm.Caller.PrincipalID, adm.RequestID, admRes}} {
			got, err := s.LookupRequest(ctx, lease.LookupRequest{Op: x.op, Identity: x.id, PrincipalID: x.prn, RequestID: x.rid, DeadlineAt: far})
			check("lookup "+string(x.op), got, err, x.want)
		}
		changed := req
		changed.Metadata = lease.Metadata{"note": "other"}
		if _, err := s.Acquire(ctx, changed); code(err) != lease.CodeIdempotencyConflict {
			t.Fatalf("%s: changed-metadata retry: %v, want idempotency_conflict", name, err)
		}
	}
}

// ATTACK: version 2 evidence does not store the identity tuple; a reader
// rebuilds it from the request. Evidence written for identity A, placed
// under identity B's evidence key (same operation, principal and request
// id, so B's scope), must not answer B's replay or lookup with A's lease:
// it must fail closed (corrupt, B quarantined). (Regression test: the
// attack did not break the code: the rebuilt record's lock key is A's,
// which does not hash from B's tuple, so strict decoding refuses it.)
func TestReviewEv2EvidenceOfAnotherIdentityFailsClosed(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	far := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	reqA := acquireReq("same-request", time.Minute, far)
	reqA.Identity.TargetID = "target-a"
	if _, err := s.Acquire(ctx, reqA); err != nil {
		t.Fatal(err)
	}
	lkA := lease.LookupRequest{Op: lease.OpAcquire, Identity: reqA.Identity, PrincipalID: reqA.Caller.PrincipalID, RequestID: reqA.RequestID, DeadlineAt: far}
	_, vA, pA := evidenceOf(t, s, lkA)
	// An acquisition's evidence is version 3 (schema 10): the attack is
	// made with the version 2 form the store detaches it into.
	s.db.View(func(tx *bbolt.Tx) error { vA = asVersion2(t, tx, pA.LockKey, vA); return nil })
	if !bytes.HasPrefix(vA, []byte(lease.EvidenceV2Prefix)) {
		t.Fatalf("A's evidence is not version 2: %q", vA)
	}
	reqB := reqA
	reqB.Identity.TargetID = "target-b"
	lkB := lkA
	lkB.Identity = reqB.Identity
	kB, _, pB := evidenceOf(t, s, lkB)
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(kB, vA) }); err != nil {
		t.Fatal(err)
	}
	if res, err := s.LookupRequest(ctx, lkB); code(err) != lease.CodeCorrupt {
		t.Fatalf("lookup of B with A's evidence: %+v %v, want corrupt", res.Lease, err)
	}
	if res, err := s.Acquire(ctx, reqB); code(err) != lease.CodeCorrupt {
		t.Fatalf("replay of B with A's evidence: %+v %v, want corrupt", res.Lease, err)
	}
	var q []byte
	s.db.View(func(tx *bbolt.Tx) error {
		q = bytes.Clone(tx.Bucket(bucketQuarantine).Get([]byte(pB.LockKey)))
		return nil
	})
	if q == nil {
		t.Fatal("B is not quarantined")
	}
}
