package bolt

// Review of the history version 2 change (archive writes
// lease.CompactHistory; forgetHistory, findHistory and History read
// lease.DecodeStoredHistory). Each test tries to break one promise of the
// change; see the review report.

import (
	"bytes"
	"context"
	"fmt"
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

var rhFar = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func rhAdmin() lease.Caller {
	return lease.Caller{PrincipalID: "prn-admin", ClientID: "client-admin", CredentialID: "key-admin"}
}

// rhEntries returns the stored history entries of lockKey, oldest first.
func rhEntries(t *testing.T, s *Store, lockKey string) (keys [][]byte, vals [][]byte) {
	t.Helper()
	prefix := historyPrefix(lockKey)
	if err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketIdent).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(v))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys, vals
}

// rhAcquire acquires a lease of target.
func rhAcquire(t *testing.T, s *Store, reqID, target string, meta lease.Metadata) lease.Result {
	t.Helper()
	req := acquireReq(reqID, time.Minute, rhFar)
	req.Identity.TargetID = target
	req.Metadata = meta
	res, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire %s: %v", reqID, err)
	}
	return res
}

func rhAcquireReq(reqID, target string, meta lease.Metadata) lease.AcquireRequest {
	req := acquireReq(reqID, time.Minute, rhFar)
	req.Identity.TargetID = target
	req.Metadata = meta
	return req
}

func rhRelease(t *testing.T, s *Store, reqID string, r *lease.Record) lease.Result {
	t.Helper()
	res, err := s.Release(context.Background(), lease.ReleaseRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ServiceInstanceID: r.ServiceInstanceID, Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: rhFar, Caller: callerOfRecord(r)}})
	if err != nil {
		t.Fatalf("release %s: %v", reqID, err)
	}
	return res
}

func rhAdminReq(reqID string, r *lease.Record, reason, incident string) lease.AdminRequest {
	return lease.AdminRequest{Identity: r.Identity(), LeaseID: r.LeaseID, FencingToken: r.FencingToken, Reason: reason, IncidentID: incident,
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: rhFar, Caller: rhAdmin()}}
}

// ATTACK 4: caller-chosen admin reasons (quotes, backslashes, JSON and hv2
// fragments, a forged ended_by and state, HTML characters, non-ASCII, the
// longest reason) and incident ids through revoke and force-release, with
// hostile metadata and a non-ASCII identity. The history listing, an
// inspect by lease id and a replay's report of the lease's state must
// answer exactly what was archived (ended_by the admin, the reason as
// sent, the token, the state); reasons validation refuses must leave no
// entry.
func TestReviewHistAdminReasonsThroughStore(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1})
	reasons := []string{
		`quote " backslash \ "},"ended_by":"prn_forged","state":"active","fencing_token":1} hv2`,
		"hv2\\nprn_forged\\nreq\\n", `<script>alert("x")</script> &amp; </b>`, "ünïcödé 😀 \u00a0nbsp ℌ ﬀ",
		strings.Repeat("é", lease.MaxReasonBytes/2), " leading and trailing ", `\u0000 \n \" literal escapes`, "x",
	}
	meta := lease.Metadata{"note": "a\nb\x00\u2028", "json": `"},"state":"active"`, "html": "<&>", "n": 1.5e300}
	for i, reason := range reasons {
		for _, op := range []lease.Op{lease.OpRevoke, lease.OpForceRelease} {
			name := fmt.Sprintf("%d-%s", i, op)
			target := "ziel-é-" + name
			acqReq := rhAcquireReq("acq-"+name, target, meta)
			a, err := s.Acquire(ctx, acqReq)
			if err != nil {
				t.Fatalf("%s: acquire: %v", name, err)
			}
			c.Add(time.Second)
			req := rhAdminReq("adm-"+name, a.Lease, reason, "inc:"+name)
			var res lease.Result
			if op == lease.OpRevoke {
				res, err = s.Revoke(ctx, req)
			} else {
				res, err = s.ForceRelease(ctx, req)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			c.Add(time.Second)
			_, vals := rhEntries(t, s, a.Lease.LockKey)
			if len(vals) != 1 {
				t.Fatalf("%s: %d entries", name, len(vals))
			}
			if !bytes.HasPrefix(vals[0], []byte(lease.HistoryV2Prefix)) {
				t.Logf("%s: stored in version 1 (fallback)", name)
			}
			h, err := s.History(ctx, lease.HistoryRequest{Identity: acqReq.Identity, DeadlineAt: rhFar, Caller: acqReq.Caller})
			if err != nil || len(h.Entries) != 1 {
				t.Fatalf("%s: history %+v, %v", name, h, err)
			}
			e := h.Entries[0]
			if encoded(t, e.Record) != encoded(t, res.Lease) || e.EndedBy != "prn-admin" || e.Reason != reason ||
				e.IncidentID != "inc:"+name || e.RequestID != "adm-"+name || e.EndedAt.UnixMilli() != res.BackendTime.UnixMilli() ||
				e.Record.FencingToken != a.Lease.FencingToken {
				t.Fatalf("%s: history entry %+v (reason %q), want %+v", name, e, e.Reason, res.Lease)
			}
			want := lease.StateRevoked
			if op == lease.OpForceRelease {
				want = lease.StateReleased
			}
			if e.Record.State != want {
				t.Fatalf("%s: state %s, want %s", name, e.Record.State, want)
			}
			in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: rhFar, Caller: acqReq.Caller})
			if err != nil || encoded(t, in.Lease) != encoded(t, res.Lease) {
				t.Fatalf("%s: inspect by lease id %+v, %v", name, in.Lease, err)
			}
			rep, err := s.Acquire(ctx, acqReq)
			if err != nil || !rep.Replayed || rep.Current == nil || encoded(t, rep.Current) != encoded(t, res.Lease) {
				t.Fatalf("%s: acquire replay %+v, %v; want current %+v", name, rep, err, res.Lease)
			}
		}
	}
	// Reasons validation refuses leave nothing behind.
	for i, reason := range []string{"a\nb", "a\u2028b", "zero\u200bwidth", "bom\ufeff", "nel\u0085", "del\x7f", "\xff", "   ",
		strings.Repeat("é", lease.MaxReasonBytes/2) + "x"} {
		target := fmt.Sprintf("refused-%d", i)
		a := rhAcquire(t, s, "acq-"+target, target, nil)
		if _, err := s.Revoke(ctx, rhAdminReq("adm-"+target, a.Lease, reason, "")); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("reason %q: %v, want invalid_lease_request", reason, err)
		}
		if _, vals := rhEntries(t, s, a.Lease.LockKey); len(vals) != 0 {
			t.Fatalf("reason %q left history: %q", reason, vals)
		}
	}
	for i, inc := range []string{"inc\nx", `inc"x`, "-inc", "inc..x", "star_sk_x", "inc x", "inçx"} {
		a := rhAcquire(t, s, fmt.Sprintf("acq-inc-%d", i), fmt.Sprintf("inc-%d", i), nil)
		if _, err := s.Revoke(ctx, rhAdminReq("adm-inc", a.Lease, "r", inc)); code(err) != lease.CodeInvalidRequest {
			t.Fatalf("incident %q: %v, want invalid_lease_request", inc, err)
		}
	}
}

// rhToV1 rewrites the stored history entry k as its version 1 bytes, as a
// schema 3 build left it.
func rhToV1(t *testing.T, s *Store, k, v []byte) {
	t.Helper()
	v1, ok := lease.ExpandHistoryAt(string(v), unpackLockKey(k[:packedLen]))
	if !ok {
		t.Fatalf("entry does not expand: %q", v)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(k, []byte(v1)) }); err != nil {
		t.Fatal(err)
	}
}

// ATTACK 5: trimming (HistoryPerIdentity) and retention (the reaper's
// retireHistorySlice -> forgetHistory) must delete the lease-id lookup and
// the time index entry of every version 2 entry they drop, and of version
// 1 entries in the same identity (a schema 3 file written on by schema
// 4). Nothing may leak, and nothing kept may lose its lookup.
func TestReviewHistTrimAndRetentionLeaveNoIndexEntries(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	o := leasetest.StoreOptions()
	o.HistoryPerIdentity, o.HistoryRetention = 2, time.Hour
	s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
	var ended []*lease.Record
	lockKeys := map[string]bool{}
	for id := 0; id < 3; id++ {
		target := fmt.Sprintf("trim-é-%d", id)
		for i := 0; i < 5; i++ {
			a := rhAcquire(t, s, fmt.Sprintf("acq-%d-%d", id, i), target, lease.Metadata{"i": float64(i), "s": "x\ny\"z"})
			lockKeys[a.Lease.LockKey] = true
			c.Add(time.Second)
			var res lease.Result
			switch i % 3 {
			case 0:
				res = rhRelease(t, s, fmt.Sprintf("rel-%d-%d", id, i), a.Lease)
			case 1:
				var err error
				if res, err = s.Revoke(ctx, rhAdminReq(fmt.Sprintf("rev-%d-%d", id, i), a.Lease, `why "not" \ é`, "inc-1")); err != nil {
					t.Fatal(err)
				}
			default:
				c.Add(2 * time.Minute) // expires; the reaper archives it
				if err := s.reap(ctx); err != nil {
					t.Fatal(err)
				}
				res.Lease = a.Lease
			}
			ended = append(ended, res.Lease)
			c.Add(time.Second)
			// Every other entry of identity 1 is made version 1, as a
			// schema 3 build wrote it.
			if id == 1 && i%2 == 0 {
				keys, vals := rhEntries(t, s, a.Lease.LockKey)
				rhToV1(t, s, keys[len(keys)-1], vals[len(vals)-1])
			}
		}
	}
	if got := kindLen(t, s, kindHistory); got != 6 {
		t.Fatalf("%d history entries after trimming, want 6", got)
	}
	if got := bucketLen(t, s, bucketHistoryExp); got != 6 {
		t.Fatalf("%d history time index entries after trimming, want 6 (leaked: %d)", got, got-6)
	}
	if got := bucketLen(t, s, bucketLeases); got != 6 {
		t.Fatalf("%d lease-id lookups after trimming, want 6 (leaked: %d)", got, got-6)
	}
	for i, r := range ended {
		in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: r.LeaseID, DeadlineAt: rhFar})
		kept := i%5 >= 3
		switch {
		case kept && (err != nil || in.Lease == nil || in.Lease.LeaseID != r.LeaseID || !in.Lease.State.Terminal()):
			t.Fatalf("kept lease %d: inspect %+v, %v", i, in.Lease, err)
		case !kept && code(err) != lease.CodeNotFound:
			t.Fatalf("trimmed lease %d: inspect %+v, %v; want not_found", i, in.Lease, err)
		}
	}
	c.Add(2 * time.Hour)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]int{"history": kindLen(t, s, kindHistory), "history time index": bucketLen(t, s, bucketHistoryExp),
		"lease-id lookups": bucketLen(t, s, bucketLeases)} {
		if n != 0 {
			t.Errorf("after retention %d %s remain", n, name)
		}
	}
}

// rhCorruptions edit a stored hv2 entry into bytes that must not decode.
var rhCorruptions = map[string]func(f []string) []string{
	"state active":            func(f []string) []string { f[lease.Hv2Record+15] = "active"; return f },
	"reason with a space":     func(f []string) []string { f[lease.Hv2Reason] = `"r" `; return f },
	"reason escaped":          func(f []string) []string { f[lease.Hv2Reason] = `"\u0072"`; return f },
	"tag of another identity": func(f []string) []string { f[lease.Hv2Tag] = strings.Repeat("A", 43); return f },
	"tuple changed":           func(f []string) []string { f[lease.Hv2Tuple+3] = "other"; return f },
	"truncated":               func(f []string) []string { return f[:lease.Hv2Lines-2] },
	"metadata spelled otherwise": func(f []string) []string {
		f[lease.Hv2Lines-1] = `{ }`
		return f
	},
	"by with a quote": func(f []string) []string { f[lease.Hv2By] = `prn-admin","state":"active`; return f },
}

// ATTACK 6: a corrupt hv2 entry fails closed as a corrupt version 1 entry
// does: the history listing skips it, an inspect by lease id does not
// find it, and a replay reports the same current state for both versions
// (never a wrong record: neither the corrupt entry's contents nor a
// guess). The retention of a corrupt entry removes it and its time index
// entry.
func TestReviewHistCorruptEntryFailsClosed(t *testing.T) {
	ctx := context.Background()
	for name, edit := range rhCorruptions {
		t.Run(name, func(t *testing.T) {
			results := map[string]string{}
			for _, form := range []string{"v2", "v1"} {
				c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
				o := leasetest.StoreOptions()
				o.HistoryRetention = time.Hour
				s := openTemp(t, Options{StoreOptions: o, Now: c.Now, ReapInterval: -1})
				s.schema10Writes = true // history version 2, which files of schema 10 hold
				acqReq := rhAcquireReq("acq-c", "corrupt-hist", lease.Metadata{"a": "b"})
				a, err := s.Acquire(ctx, acqReq)
				if err != nil {
					t.Fatal(err)
				}
				c.Add(time.Second)
				adm := rhAdminReq("rev-c", a.Lease, "r", "")
				rev, err := s.Revoke(ctx, adm)
				if err != nil {
					t.Fatal(err)
				}
				keys, vals := rhEntries(t, s, a.Lease.LockKey)
				if len(vals) != 1 || !bytes.HasPrefix(vals[0], []byte(lease.HistoryV2Prefix)) {
					t.Fatalf("not stored in version 2: %q", vals)
				}
				bad := []byte(strings.Join(edit(strings.Split(string(vals[0]), "\n")), "\n"))
				if form == "v1" { // the same corruption, of the version 1 form
					v1, ok := lease.ExpandHistory(string(bad))
					if !ok {
						v1s, _ := lease.ExpandHistory(string(vals[0]))
						v1 = v1s[:len(v1s)-3] // a truncated version 1 entry
					}
					bad = []byte(v1)
				}
				if _, err := lease.DecodeStoredHistory(bad); code(err) != lease.CodeCorrupt {
					t.Fatalf("%s: the corruption decodes: %v", form, err)
				}
				if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketIdent).Put(keys[0], bad) }); err != nil {
					t.Fatal(err)
				}
				h, err := s.History(ctx, lease.HistoryRequest{Identity: acqReq.Identity, DeadlineAt: rhFar, Caller: acqReq.Caller})
				if err != nil || len(h.Entries) != 0 {
					t.Fatalf("%s: history %+v, %v; want the corrupt entry skipped", form, h.Entries, err)
				}
				if in, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: a.Lease.LeaseID, DeadlineAt: rhFar}); code(err) != lease.CodeNotFound {
					t.Fatalf("%s: inspect by lease id %+v, %v; want not_found", form, in.Lease, err)
				}
				rep, err := s.Acquire(ctx, acqReq)
				cur := "<nil>"
				if rep.Current != nil { // lease ids differ between the two stores
					cur = fmt.Sprintf("current %s token %d expires %s", rep.Current.State, rep.Current.FencingToken, rep.Current.ExpiresAt)
				}
				results[form] = fmt.Sprintf("%v %s", code(err), cur)
				if rep.Current != nil && rep.Current.State == lease.StateRevoked {
					t.Fatalf("%s: the replay reports the corrupt entry: %s", form, cur)
				}
				rr, err := s.Revoke(ctx, adm)
				if err != nil || !rr.Replayed || encoded(t, rr.Lease) != encoded(t, rev.Lease) {
					t.Fatalf("%s: revoke replay %+v, %v", form, rr, err)
				}
				c.Add(2 * time.Hour)
				if err := s.reap(ctx); err != nil {
					t.Fatal(err)
				}
				if n, m := kindLen(t, s, kindHistory), bucketLen(t, s, bucketHistoryExp); n != 0 || m != 0 {
					t.Fatalf("%s: after retention %d entries, %d index entries", form, n, m)
				}
				results[form+" leases"] = fmt.Sprint(bucketLen(t, s, bucketLeases))
			}
			if results["v1"] != results["v2"] || results["v1 leases"] != results["v2 leases"] {
				t.Fatalf("a corrupt version 2 entry is answered otherwise than a corrupt version 1 one:\n v2 %s (%s lookups left)\n v1 %s (%s lookups left)",
					results["v2"], results["v2 leases"], results["v1"], results["v1 leases"])
			}
		})
	}
}

// rhBackup is a backup of the file at path as a build's Backup writes it.
func rhBackup(t *testing.T, path string, at time.Time) []byte {
	t.Helper()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := backupfile.Write(&buf, backupfile.Header{Backend: BackendName, CreatedAt: at.UTC(), Counts: map[string]int64{"counters": 1}},
		func(w io.Writer) error { _, err := io.Copy(w, bytes.NewReader(file)); return err }); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ATTACK 7: backups of a schema 4 file (hv2 history, taken by Backup) and
// of a schema 3 file (version 1 evidence and history) restore, and the
// restored namespace answers the history, an inspect by lease id and every
// lookup exactly; a file holding both versions of history trims them after
// recovery.
func TestReviewHistBackupRestoreBothSchemas(t *testing.T) {
	ctx := context.Background()
	for _, schema := range []string{schemaVersion, schemaVersionV3} {
		t.Run("schema"+schema, func(t *testing.T) {
			dir := t.TempDir()
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			o := Options{StoreOptions: leasetest.StoreOptions(), Now: c.Now, ReapInterval: -1}
			src := filepath.Join(dir, "src.db")
			s, err := Open(src, o)
			if err != nil {
				t.Fatal(err)
			}
			l := live(t, s, c, "backup-hist", rhFar)
			var backup []byte
			if schema == schemaVersion {
				var buf bytes.Buffer
				if _, err := s.Backup(ctx, &buf); err != nil {
					t.Fatal(err)
				}
				backup = buf.Bytes()
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				v1s := map[string]string{}
				for _, lk := range l.lookups(rhFar) {
					k, v, p := evidenceOf(t, s, lk)
					v1, _ := lease.ExpandEvidence(string(v), p.Identity)
					v1s[string(k)] = v1
				}
				for k, v := range historyOf(t, s, l) {
					v1, _ := lease.ExpandHistoryAt(string(v), unpackLockKey([]byte(k)[:packedLen]))
					v1s[k] = v1
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
				backup = rhBackup(t, src, c.Now())
			}
			target := filepath.Join(dir, "restored.db")
			if _, err := NewNamespace(target, o).Restore(ctx, bytes.NewReader(backup)); err != nil {
				t.Fatalf("restore: %v", err)
			}
			r, err := Open(target, o)
			if err != nil {
				t.Fatalf("open restored: %v", err)
			}
			defer r.Close()
			l.endedReads(t, r, rhFar)
			l.lookupsAnswer(t, r, rhFar)
		})
	}
}
