package bolt

// Review (s30/31) attacks on 0c82656: Acquire and Renew warm the record
// memo with the bytes they committed, and a write transaction serves its
// active record from the memo (RecordMemo.Known, a deep copy) when the
// exact bytes are there. Each test checks what the store answers against
// the stored truth (the bytes in the file, strictly decoded), so it fails
// if a memo hit ever differs from a strict decode of the bytes it is
// served for, or if a caller's copy reaches the memo.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
	"github.com/starintel/starlease/lease"
)

// s30Far is a deadline no test reaches.
var s30Far = time.Now().Add(24 * time.Hour)

func s30Identity(n int) lease.Identity {
	id := testIdentity
	id.TargetID = fmt.Sprintf("s30-target-%d", n)
	return id
}

// s30ReacquireGets acquires testIdentity anew and fails t unless the
// lease gets fencing token want: the counter goes on from where it was.
func s30ReacquireGets(ctx context.Context, t *testing.T, s *Store, want uint64) {
	t.Helper()
	next, err := s30Acquire(ctx, s, testIdentity, "s30-acq-2", time.Minute, nil)
	if err != nil || next.Lease.FencingToken != want {
		t.Fatalf("reacquire: %+v, %v, want token %d", next.Lease, err, want)
	}
}

func s30Acquire(ctx context.Context, s *Store, id lease.Identity, reqID string, ttl time.Duration, md lease.Metadata) (lease.Result, error) {
	req := acquireReq(reqID, ttl, s30Far)
	req.Identity = id
	req.Metadata = md
	return s.Acquire(ctx, req)
}

// s30Holder is what a holder knows of its lease, copied out of a result
// before anyone scribbles on the result.
type s30Holder struct {
	id       lease.Identity
	leaseID  string
	token    uint64
	instance string
	caller   lease.Caller
}

func s30HolderOf(r *lease.Record) s30Holder {
	return s30Holder{id: r.Identity(), leaseID: r.LeaseID, token: r.FencingToken, instance: r.ServiceInstanceID, caller: callerOfRecord(r)}
}

func (h s30Holder) renew(ctx context.Context, s *Store, reqID string, ttl time.Duration) (lease.Result, error) {
	return s.Renew(ctx, lease.RenewRequest{Identity: h.id, LeaseID: h.leaseID, FencingToken: h.token, ServiceInstanceID: h.instance,
		TTL: ttl, Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: s30Far, Caller: h.caller}})
}

func (h s30Holder) release(ctx context.Context, s *Store, reqID string) (lease.Result, error) {
	return s.Release(ctx, lease.ReleaseRequest{Identity: h.id, LeaseID: h.leaseID, FencingToken: h.token, ServiceInstanceID: h.instance,
		Mutation: lease.Mutation{RequestID: reqID, DeadlineAt: s30Far, Caller: h.caller}})
}

func s30Quarantined(t *testing.T, s *Store, lockKey string) string {
	t.Helper()
	var q string
	if err := s.db.View(func(tx *bbolt.Tx) error {
		q = string(tx.Bucket(bucketQuarantine).Get([]byte(lockKey)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return q
}

func s30ClearQuarantine(t *testing.T, s *Store, lockKey string) {
	t.Helper()
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketQuarantine).Delete([]byte(lockKey)) }); err != nil {
		t.Fatal(err)
	}
}

// s30MemoAgrees checks the memo's answer for raw, if it has one, against
// a strict decode of raw, and that the answer is a private copy.
func s30MemoAgrees(t *testing.T, s *Store, raw []byte) (hit bool) {
	t.Helper()
	known, ok := s.records.Known(raw)
	if !ok {
		return false
	}
	want, err := lease.DecodeStoredRecord(raw)
	if err != nil {
		t.Fatalf("the memo holds bytes the strict decoder refuses (%v): %q", err, raw)
	}
	if !reflect.DeepEqual(known, want) {
		t.Fatalf("memo hit differs from a strict decode of the same bytes:\n memo   %+v\n strict %+v", known, want)
	}
	// Scribble on the copy: the next hit must not see it.
	s30Scribble(known)
	again, _ := s.records.Known(raw)
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("a caller's change to a memo hit reached the memo:\n memo   %+v\n strict %+v", again, want)
	}
	return true
}

// s30Scribble changes every field of r a holder check, the fencing or a
// reader looks at, and its metadata map in place.
func s30Scribble(r *lease.Record) {
	if r == nil {
		return
	}
	r.LockKey = "lease:scribbled"
	r.TargetID = "scribbled"
	r.LeaseID = "lease_SCRIBBLED"
	r.OwnerPrincipalID = "prn-thief"
	r.ServiceInstanceID = "instance-thief"
	r.FencingToken += 1000
	r.ExpiresAt = r.ExpiresAt.Add(1000 * time.Hour)
	r.TTLMs = 1
	r.State = lease.StateRevoked
	if r.Metadata != nil {
		for k := range r.Metadata {
			r.Metadata[k] = "scribbled"
		}
		r.Metadata["injected"] = "yes"
	}
}

// s30Truth is the strict decode of the stored active record of lockKey.
func s30Truth(t *testing.T, s *Store, lockKey string) *lease.Record {
	t.Helper()
	v := storedActive(t, s, lockKey)
	if v == nil {
		return nil
	}
	r, err := lease.DecodeStoredRecord(v)
	if err != nil {
		t.Fatalf("stored record does not decode: %v", err)
	}
	return r
}

// ---------------------------------------------------------------------------
// Records returned by Acquire, Renew, Inspect and Release (and by the memo
// itself) are the caller's: scribbling on every field and on the metadata
// map changes nothing the store answers afterwards, and the memo's answer
// for the stored bytes stays the strict decode of those bytes.
func TestReviewS30ScribbledResultsNeverReachTheStoreOrTheMemo(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	md := lease.Metadata{"region": "eu-west", "canary": true, "shard": "s-7"}
	acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, md)
	if err != nil {
		t.Fatal(err)
	}
	h := s30HolderOf(acq.Lease)
	lockKey := acq.Lease.LockKey
	v0 := storedActive(t, s, lockKey)
	truth0 := s30Truth(t, s, lockKey)
	if truth0.Metadata["region"] != "eu-west" || truth0.FencingToken != 1 {
		t.Fatalf("stored after acquire: %+v", truth0)
	}
	if !s30MemoAgrees(t, s, v0) {
		t.Fatal("the acquire did not warm the memo with its record (the change under review does nothing)")
	}
	// The caller scribbles on its result and on the metadata map it passed.
	s30Scribble(acq.Lease)
	md["region"] = "us-east"
	md["injected"] = "request-side"
	delete(md, "canary")
	s30MemoAgrees(t, s, v0)

	insp, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: s30Far})
	if err != nil || !reflect.DeepEqual(insp.Lease, truth0) {
		t.Fatalf("inspect after scribbling: %+v, %v; want the stored %+v", insp.Lease, err, truth0)
	}
	s30Scribble(insp.Lease)

	// A holder using the scribbled values is no holder.
	bad := h
	bad.token += 1000
	if _, err := bad.renew(ctx, s, "s30-ren-bad", time.Minute); code(err) != lease.CodeLost {
		t.Fatalf("renew with the scribbled token: %v, want lease_lost", err)
	}
	bad = h
	bad.leaseID = "lease_SCRIBBLED"
	if _, err := bad.release(ctx, s, "s30-rel-bad"); code(err) != lease.CodeLost {
		t.Fatalf("release with the scribbled lease id: %v, want lease_lost", err)
	}
	bad = h
	bad.caller.PrincipalID = "prn-thief"
	if _, err := bad.renew(ctx, s, "s30-ren-thief", time.Minute); code(err) != lease.CodeLost {
		t.Fatalf("renew by another principal: %v, want lease_lost", err)
	}
	if got := storedActive(t, s, lockKey); !bytes.Equal(got, v0) {
		t.Fatalf("refused mutations changed the record: %q", got)
	}

	// The true holder renews; the result is the stored record.
	c.Add(10 * time.Second)
	ren, err := h.renew(ctx, s, "s30-ren-1", 2*time.Minute)
	if err != nil || ren.Code != lease.CodeRenewed {
		t.Fatalf("renew: %+v, %v", ren, err)
	}
	v1 := storedActive(t, s, lockKey)
	truth1 := s30Truth(t, s, lockKey)
	if !reflect.DeepEqual(ren.Lease, truth1) {
		t.Fatalf("renew returned %+v, stored %+v", ren.Lease, truth1)
	}
	if truth1.Metadata["region"] != "eu-west" || truth1.Metadata["canary"] != true || truth1.Metadata["injected"] != nil ||
		truth1.FencingToken != 1 || truth1.LeaseID != h.leaseID || truth1.OwnerPrincipalID != h.caller.PrincipalID {
		t.Fatalf("the renewed record carries a scribble: %+v", truth1)
	}
	if !s30MemoAgrees(t, s, v1) {
		t.Fatal("the renewal did not warm the memo")
	}
	s30Scribble(ren.Lease)
	s30MemoAgrees(t, s, v1)

	// A replay of the renewal answers what was stored, not the scribble.
	rep, err := h.renew(ctx, s, "s30-ren-1", 2*time.Minute)
	if err != nil || rep.Lease.LeaseID != h.leaseID || rep.Lease.FencingToken != 1 || rep.Lease.Metadata["region"] != "eu-west" {
		t.Fatalf("replayed renewal: %+v, %v", rep.Lease, err)
	}
	s30Scribble(rep.Lease)

	// Release by the true holder; the result is the stored record, ended.
	rel, err := h.release(ctx, s, "s30-rel-1")
	if err != nil || rel.Code != lease.CodeReleased {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	want := truth1.Clone()
	want.State = lease.StateReleased
	if !reflect.DeepEqual(rel.Lease, want) {
		t.Fatalf("release returned %+v, want %+v", rel.Lease, want)
	}
	s30Scribble(rel.Lease)
	if v := storedActive(t, s, lockKey); v != nil {
		t.Fatalf("an active record is left after the release: %q", v)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: h.leaseID, DeadlineAt: s30Far})
	if err != nil || !reflect.DeepEqual(got.Lease, want) {
		t.Fatalf("inspect of the released lease: %+v, %v; want %+v", got.Lease, err, want)
	}
	// The fencing token goes on from the stored counter.
	s30ReacquireGets(ctx, t, s, 2)
}

// ---------------------------------------------------------------------------
// Bytes changed underneath a warmed record (s.db.Update, as damage or an
// operator would) are judged by what they are: another valid record of the
// identity is the truth, corrupt bytes fail closed whatever the operation,
// a record of another identity fails closed even for that identity's own
// holder, and the memo's earlier bytes (restored verbatim) are served as
// exactly what they decode to.
func TestReviewS30BytesChangedUnderneathAreJudgedStrictly(t *testing.T) {
	ctx := context.Background()

	t.Run("another valid record of the identity", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, lease.Metadata{"region": "eu"})
		if err != nil {
			t.Fatal(err)
		}
		h := s30HolderOf(acq.Lease)
		v0 := storedActive(t, s, h.lockKey(t))
		if !s30MemoAgrees(t, s, v0) {
			t.Fatal("acquire did not warm the memo")
		}
		// Replace with another lease of the same identity: other id,
		// token 7, another owner.
		other := s30Truth(t, s, acq.Lease.LockKey)
		other.LeaseID = lease.NewLeaseID(other.AcquiredAt)
		other.FencingToken = 7
		other.OwnerPrincipalID = "prn-other"
		other.Metadata = lease.Metadata{"region": "ap"}
		vOther, err := lease.CompactRecord(other)
		if err != nil {
			t.Fatal(err)
		}
		putActiveRaw(t, s, other.LockKey, vOther)
		if _, err := h.renew(ctx, s, "s30-ren-1", time.Minute); code(err) != lease.CodeLost {
			t.Fatalf("renew of the replaced lease (warmed bytes no longer stored): %v, want lease_lost", err)
		}
		if _, err := h.release(ctx, s, "s30-rel-1"); code(err) != lease.CodeLost {
			t.Fatalf("release of the replaced lease: %v, want lease_lost", err)
		}
		if _, err := s30Acquire(ctx, s, testIdentity, "s30-acq-2", time.Minute, nil); code(err) != lease.CodeConflict {
			t.Fatalf("acquire over the other live lease: %v, want conflict", err)
		}
		if got := storedActive(t, s, other.LockKey); !bytes.Equal(got, vOther) {
			t.Fatal("refused mutations changed the stored record")
		}
		oh := s30HolderOf(other)
		ren, err := oh.renew(ctx, s, "s30-ren-2", 3*time.Minute)
		if err != nil || ren.Lease.LeaseID != other.LeaseID || ren.Lease.FencingToken != 7 || ren.Lease.Metadata["region"] != "ap" {
			t.Fatalf("renew by the stored lease's holder: %+v, %v", ren.Lease, err)
		}
		// The old bytes, warmed by the acquire, come back verbatim: they
		// are the truth again, and what they say is what the memo says.
		putActiveRaw(t, s, h.lockKey(t), v0)
		s30MemoAgrees(t, s, v0)
		if _, err := oh.release(ctx, s, "s30-rel-2"); code(err) != lease.CodeLost {
			t.Fatalf("release by the replaced holder after the old bytes came back: %v, want lease_lost", err)
		}
		rel, err := h.release(ctx, s, "s30-rel-3")
		if err != nil || rel.Lease.LeaseID != h.leaseID || rel.Lease.FencingToken != 1 || rel.Lease.Metadata["region"] != "eu" {
			t.Fatalf("release by the restored bytes' holder: %+v, %v", rel.Lease, err)
		}
		if q := s30Quarantined(t, s, h.lockKey(t)); q != "" {
			t.Fatalf("valid records were quarantined: %q", q)
		}
	})

	t.Run("corrupt bytes fail closed for every operation", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, lease.Metadata{"region": "eu"})
		if err != nil {
			t.Fatal(err)
		}
		h := s30HolderOf(acq.Lease)
		lockKey := acq.Lease.LockKey
		ren, err := h.renew(ctx, s, "s30-ren-0", 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		v := storedActive(t, s, lockKey)
		if !s30MemoAgrees(t, s, v) {
			t.Fatal("renew did not warm the memo")
		}
		// One byte of the lock key's hash changed: the tuple no longer
		// hashes to it. (A byte of the lease id changed would be another
		// valid record, judged as such in the subtest above.)
		flipped := bytes.Clone(v)
		flipped[bytes.IndexByte(flipped, '\n')+3] ^= 0x01
		badState := bytes.Replace(v, []byte("\nactive\n"), []byte("\nActive\n"), 1)
		if bytes.Equal(badState, v) {
			badState = bytes.Replace(v, []byte(`"state":"active"`), []byte(`"state":"Active"`), 1)
		}
		variants := map[string][]byte{
			"empty":         {},
			"one byte":      v[:1],
			"prefix only":   v[:min(len(v), 4)],
			"half":          v[:len(v)/2],
			"all but last":  v[:len(v)-1],
			"trailing byte": append(bytes.Clone(v), ' '),
			"flipped bit":   flipped,
			"bad state":     badState,
		}
		n := 0
		for name, bad := range variants {
			bad := bytes.Clone(bad)
			putActiveRaw(t, s, lockKey, bad)
			ops := map[string]func() error{
				"renew": func() error {
					_, err := h.renew(ctx, s, fmt.Sprint("s30-ren-", n), time.Minute)
					return err
				},
				"release": func() error {
					_, err := h.release(ctx, s, fmt.Sprint("s30-rel-", n))
					return err
				},
				"acquire": func() error {
					_, err := s30Acquire(ctx, s, testIdentity, fmt.Sprint("s30-acq-x", n), time.Minute, nil)
					return err
				},
				"force release": func() error {
					_, err := s.ForceRelease(ctx, lease.AdminRequest{Identity: testIdentity, LeaseID: h.leaseID, FencingToken: h.token,
						Reason: "review", Mutation: lease.Mutation{RequestID: fmt.Sprint("s30-frc-", n), DeadlineAt: s30Far, Caller: h.caller}})
					return err
				},
				"inspect": func() error {
					_, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: s30Far})
					return err
				},
			}
			for op, f := range ops {
				n++
				s30ClearQuarantine(t, s, lockKey)
				if err := f(); code(err) != lease.CodeCorrupt {
					t.Errorf("%s over %s bytes: %v, want corrupt", op, name, err)
				}
				if op != "inspect" && s30Quarantined(t, s, lockKey) == "" {
					t.Errorf("%s over %s bytes left no quarantine mark", op, name)
				}
				if got := storedActive(t, s, lockKey); !bytes.Equal(got, bad) {
					t.Fatalf("%s over %s bytes changed them to %q", op, name, got)
				}
			}
		}
		// The warmed bytes, restored, are the renewed lease again.
		putActiveRaw(t, s, lockKey, v)
		rel, err := h.release(ctx, s, "s30-rel-final")
		if err != nil || rel.Lease.ExpiresAt != ren.Lease.ExpiresAt || rel.Lease.FencingToken != 1 {
			t.Fatalf("release over the restored bytes: %+v, %v (renewed %+v)", rel.Lease, err, ren.Lease)
		}
	})

	t.Run("another identity's record fails closed even for its own holder", func(t *testing.T) {
		s := openTemp(t, Options{ReapInterval: -1})
		mineRes, err := s30Acquire(ctx, s, s30Identity(1), "s30-acq-1", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		theirsRes, err := s30Acquire(ctx, s, s30Identity(2), "s30-acq-2", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		mine, theirs := s30HolderOf(mineRes.Lease), s30HolderOf(theirsRes.Lease)
		ren, err := theirs.renew(ctx, s, "s30-ren-t", 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		vTheirs := storedActive(t, s, theirsRes.Lease.LockKey)
		if !s30MemoAgrees(t, s, vTheirs) {
			t.Fatal("their renewal did not warm the memo")
		}
		vMine := storedActive(t, s, mineRes.Lease.LockKey)
		putActiveRaw(t, s, mineRes.Lease.LockKey, vTheirs)
		// Their holder, naming my identity with their lease id and token
		// (which the copied, warmed record holds), must not be served.
		crossed := theirs
		crossed.id = mine.id
		if _, err := crossed.renew(ctx, s, "s30-ren-x", time.Minute); code(err) != lease.CodeCorrupt {
			t.Fatalf("renew naming my identity with their lease over their record: %v, want corrupt", err)
		}
		if _, err := crossed.release(ctx, s, "s30-rel-x"); code(err) != lease.CodeCorrupt {
			t.Fatalf("release naming my identity with their lease over their record: %v, want corrupt", err)
		}
		if _, err := mine.renew(ctx, s, "s30-ren-m", time.Minute); code(err) != lease.CodeCorrupt {
			t.Fatalf("my renew over their record: %v, want corrupt", err)
		}
		if _, err := s30Acquire(ctx, s, mine.id, "s30-acq-3", time.Minute, nil); code(err) != lease.CodeCorrupt {
			t.Fatalf("acquire of my identity over their record: %v, want corrupt", err)
		}
		if got := storedActive(t, s, mineRes.Lease.LockKey); !bytes.Equal(got, vTheirs) {
			t.Fatal("the misplaced record was changed")
		}
		// Their own lease is untouched and theirs to release.
		if got := storedActive(t, s, theirsRes.Lease.LockKey); !bytes.Equal(got, vTheirs) {
			t.Fatal("their record was changed")
		}
		rel, err := theirs.release(ctx, s, "s30-rel-t")
		if err != nil || rel.Lease.ExpiresAt != ren.Lease.ExpiresAt {
			t.Fatalf("their release: %+v, %v", rel.Lease, err)
		}
		// My bytes back: mine again.
		putActiveRaw(t, s, mineRes.Lease.LockKey, vMine)
		if _, err := mine.release(ctx, s, "s30-rel-m"); err != nil {
			t.Fatalf("my release over my restored bytes: %v", err)
		}
	})
}

func (h s30Holder) lockKey(t *testing.T) string {
	t.Helper()
	req := acquireReq("s30-key", time.Minute, s30Far)
	req.Identity = h.id
	_, p, err := lease.PrepareAcquire(req, lease.StoreOptions{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	return p.LockKey
}

// ---------------------------------------------------------------------------
// A memo full of valid records of my identity that were never stored
// (other lease ids, tokens, owners; more than RecordMemoMax, so it evicts)
// gives no one my lease, and evicted records of real leases are judged by
// their stored bytes.
func TestReviewS30MemoFullOfForgedRecordsOfMyIdentity(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	const real = 24
	holders := make([]s30Holder, real)
	var wg sync.WaitGroup
	for i := range holders {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res, err := s30Acquire(ctx, s, s30Identity(i), fmt.Sprint("s30-acq-", i), time.Hour, lease.Metadata{"n": fmt.Sprint(i)})
			if err != nil {
				t.Error(err)
				return
			}
			holders[i] = s30HolderOf(res.Lease)
			s30Scribble(res.Lease)
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	mine := holders[0]
	truth := s30Truth(t, s, mine.lockKey(t))
	forged := []s30Holder{}
	for i := 0; i < lease.RecordMemoMax+300; i++ {
		f := truth.Clone()
		switch i % 4 {
		case 0: // same lease id, another token
			f.FencingToken = uint64(i + 2)
		case 1: // another lease id, same token
			f.LeaseID = lease.NewLeaseID(f.AcquiredAt)
		case 2: // same lease, another owner and instance
			f.OwnerPrincipalID = fmt.Sprint("prn-thief-", i)
			f.ServiceInstanceID = fmt.Sprint("instance-thief-", i)
		case 3: // same lease, other expiry and metadata
			f.ExpiresAt = f.ExpiresAt.Add(-time.Duration(i) * time.Millisecond)
			f.Metadata = lease.Metadata{"n": "forged"}
		}
		b, err := lease.CompactRecord(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.records.Decode(b); err != nil {
			t.Fatal(err)
		}
		if i%4 != 3 && len(forged) < 12 {
			h := s30HolderOf(f)
			h.caller = lease.Caller{PrincipalID: f.OwnerPrincipalID, ClientID: f.OwnerClientID, CredentialID: f.OwnerCredentialID}
			forged = append(forged, h)
		}
	}
	if n := s.records.Len(); n > lease.RecordMemoMax {
		t.Fatalf("memo holds %d records, bound %d", n, lease.RecordMemoMax)
	}
	for i, f := range forged {
		if _, err := f.renew(ctx, s, fmt.Sprint("s30-fren-", i), time.Minute); code(err) != lease.CodeLost {
			t.Fatalf("renew by forged holder %+v: %v, want lease_lost", f, err)
		}
		if _, err := f.release(ctx, s, fmt.Sprint("s30-frel-", i)); code(err) != lease.CodeLost {
			t.Fatalf("release by forged holder %+v: %v, want lease_lost", f, err)
		}
	}
	if got := s30Truth(t, s, mine.lockKey(t)); !reflect.DeepEqual(got, truth) {
		t.Fatalf("my record changed under forged calls: %+v", got)
	}
	// Every real lease, warmed by its acquire and mostly evicted since:
	// a wrong token is refused, the right one renews then releases.
	for i, h := range holders {
		v := storedActive(t, s, h.lockKey(t))
		s30MemoAgrees(t, s, v)
		wrong := h
		wrong.token++
		if _, err := wrong.release(ctx, s, fmt.Sprint("s30-wrel-", i)); code(err) != lease.CodeLost {
			t.Fatalf("lease %d, wrong token: %v, want lease_lost", i, err)
		}
		ren, err := h.renew(ctx, s, fmt.Sprint("s30-ren-", i), 2*time.Hour)
		if err != nil || ren.Lease.FencingToken != 1 || ren.Lease.Metadata["n"] != fmt.Sprint(i) {
			t.Fatalf("lease %d renew: %+v, %v", i, ren.Lease, err)
		}
		s30MemoAgrees(t, s, storedActive(t, s, h.lockKey(t)))
		rel, err := h.release(ctx, s, fmt.Sprint("s30-rel-", i))
		if err != nil || rel.Lease.LeaseID != h.leaseID || rel.Lease.ExpiresAt != ren.Lease.ExpiresAt {
			t.Fatalf("lease %d release: %+v, %v", i, rel.Lease, err)
		}
		if c, err := (faults{s}).Counter(ctx, h.lockKey(t)); err != nil || c != 1 {
			t.Fatalf("lease %d counter %d (%v), want 1", i, c, err)
		}
	}
	if n := s.records.Len(); n > lease.RecordMemoMax {
		t.Fatalf("memo holds %d records, bound %d", n, lease.RecordMemoMax)
	}
}

// ---------------------------------------------------------------------------
// A function that fails in a shared transaction is rolled back alone: the
// acquire before it in the batch runs once, commits, and is answered with
// what it committed (warm in the memo); the failing function ran once and
// left no write; the lease is the only one, at token 1.
func TestReviewS30GroupFailureRollsBackOnlyItsFunction(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	lockKey := s30Holder{id: testIdentity}.lockKey(t)
	release := make(chan struct{})
	first := gate(t, &s.group, release)
	acqDone := make(chan struct{})
	var acq lease.Result
	var acqErr error
	go func() {
		defer close(acqDone)
		acq, acqErr = s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, nil)
	}()
	waitQueued(t, &s.group, 1)
	var seen []byte
	runs := 0
	failErr := make(chan error, 1)
	go func() {
		failErr <- s.mutate(ctx, func(tx *layered.View) error {
			runs++
			seen = bytes.Clone(tx.Bucket(bucketIdent).Get(activeKey(lockKey)))
			if err := tx.Bucket(bucketMeta).Put([]byte("s30-poison"), []byte("x")); err != nil {
				return err
			}
			return errors.New("s30: roll this function back")
		})
	}()
	waitQueued(t, &s.group, 2)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-acqDone
	if err := <-failErr; err == nil {
		t.Fatal("the failing function succeeded")
	}
	if acqErr != nil {
		t.Fatal(acqErr)
	}
	if runs != 1 {
		t.Fatalf("the failing function ran %d times, want once", runs)
	}
	if seen == nil {
		t.Fatal("the failing function did not share the acquire's transaction (test setup)")
	}
	stored := storedActive(t, s, lockKey)
	if !bytes.Equal(stored, seen) {
		t.Fatal("the stored record is not the one the acquire wrote in the shared transaction")
	}
	if !s30MemoAgrees(t, s, stored) {
		t.Fatal("the committed record is not warm")
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketMeta).Get([]byte("s30-poison")) != nil {
			return errors.New("the failing function's write was committed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	truth := s30Truth(t, s, lockKey)
	if acq.Lease.LeaseID != truth.LeaseID || acq.Lease.FencingToken != 1 || truth.FencingToken != 1 {
		t.Fatalf("acquire answered %+v, stored %+v", acq.Lease, truth)
	}
	if _, err := s30HolderOf(truth).release(ctx, s, "s30-rel-1"); err != nil {
		t.Fatal(err)
	}
	if c, _ := (faults{s}).Counter(ctx, lockKey); c != 1 {
		t.Fatalf("counter %d, want 1", c)
	}
}

// ---------------------------------------------------------------------------
// Bytes in the memo that are not the stored ones change no answer: a
// record's bytes warmed by the acquire that wrote them, then replaced in
// the store by another valid record of the same lease (as damage or a
// repair would), are not what inspect and release judge by; stored again
// for real, they are what they decode to. (The group commit once ran an
// acquire twice when a batch-mate failed, and a replayed second run could
// leave its rolled-back first run's bytes warm; functions now run once,
// and this is the judgment that case relied on.)
func TestReviewS30WarmBytesNotStoredChangeNoAnswer(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	lockKey := s30Holder{id: testIdentity, instance: "instance-1", caller: lease.Caller{PrincipalID: "prn-actor"}}.lockKey(t)
	acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, lease.Metadata{"run": "first"})
	if err != nil {
		t.Fatal(err)
	}
	firstRun := storedActive(t, s, lockKey)
	if !s30MemoAgrees(t, s, firstRun) {
		t.Fatal("the acquire's committed record is not warm (test setup)")
	}
	ghost, err := lease.DecodeStoredRecord(firstRun)
	if err != nil || ghost.LeaseID != acq.Lease.LeaseID {
		t.Fatalf("stored %+v, %v; acquire answered %+v", ghost, err, acq.Lease)
	}
	r := ghost.Clone()
	r.ExpiresAt = r.ExpiresAt.Add(30 * time.Second)
	r.TTLMs += 30000
	r.Metadata = lease.Metadata{"run": "substitute"}
	substitute, err := lease.CompactRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	putActiveRaw(t, s, lockKey, substitute)
	if got := storedActive(t, s, lockKey); !bytes.Equal(got, substitute) {
		t.Fatalf("stored %q, want the substitute", got)
	}
	// Everything is judged by the substitute, not by the warm bytes.
	h := s30HolderOf(ghost)
	insp, err := s.Inspect(ctx, lease.InspectRequest{Identity: testIdentity, DeadlineAt: s30Far})
	if err != nil || insp.Lease.Metadata["run"] != "substitute" {
		t.Fatalf("inspect: %+v, %v", insp.Lease, err)
	}
	rel, err := h.release(ctx, s, "s30-rel-1")
	if err != nil || rel.Lease.Metadata["run"] != "substitute" || rel.Lease.ExpiresAt != ghost.ExpiresAt.Add(30*time.Second) {
		t.Fatalf("release judged %+v, %v; want the substitute record", rel.Lease, err)
	}
	// The warm bytes, stored now for real, are what they decode to.
	putActiveRaw(t, s, lockKey, firstRun)
	s30MemoAgrees(t, s, firstRun)
	rel, err = h.release(ctx, s, "s30-rel-2")
	if err != nil || rel.Lease.Metadata["run"] != "first" || rel.Lease.ExpiresAt != ghost.ExpiresAt {
		t.Fatalf("release over the first run's bytes: %+v, %v", rel.Lease, err)
	}
}

// ---------------------------------------------------------------------------
// A renewal and a release of one lease in one transaction, in both orders:
// the second sees the first's bytes (written in the transaction, not yet in
// the memo), and nothing stale is served after the commit.
func TestReviewS30RenewAndReleaseInOneBatch(t *testing.T) {
	ctx := context.Background()
	for _, renewFirst := range []bool{true, false} {
		t.Run(fmt.Sprint("renew first ", renewFirst), func(t *testing.T) {
			c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
			s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
			acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			h := s30HolderOf(acq.Lease)
			lockKey := acq.Lease.LockKey
			c.Add(5 * time.Second)
			release := make(chan struct{})
			first := gate(t, &s.group, release)
			var ren, rel lease.Result
			var renErr, relErr error
			var wg sync.WaitGroup
			doRenew := func() {
				defer wg.Done()
				ren, renErr = h.renew(ctx, s, "s30-ren-1", 5*time.Minute)
			}
			doRelease := func() {
				defer wg.Done()
				rel, relErr = h.release(ctx, s, "s30-rel-1")
			}
			wg.Add(2)
			if renewFirst {
				go doRenew()
				waitQueued(t, &s.group, 1)
				go doRelease()
			} else {
				go doRelease()
				waitQueued(t, &s.group, 1)
				go doRenew()
			}
			waitQueued(t, &s.group, 2)
			close(release)
			wg.Wait()
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			if relErr != nil {
				t.Fatalf("release: %v", relErr)
			}
			if renewFirst {
				if renErr != nil {
					t.Fatalf("renew: %v", renErr)
				}
				if rel.Lease.ExpiresAt != ren.Lease.ExpiresAt || rel.Lease.TTLMs != 5*60*1000 {
					t.Fatalf("the release ended %+v, not the renewed record %+v", rel.Lease, ren.Lease)
				}
			} else {
				if code(renErr) != lease.CodeLost {
					t.Fatalf("renew after the release: %+v, %v, want lease_lost", ren, renErr)
				}
				if rel.Lease.ExpiresAt != acq.Lease.ExpiresAt {
					t.Fatalf("the release ended %+v, want the acquired record", rel.Lease)
				}
			}
			if v := storedActive(t, s, lockKey); v != nil {
				t.Fatalf("an active record is left: %q", v)
			}
			if _, err := h.renew(ctx, s, "s30-ren-2", time.Minute); code(err) != lease.CodeLost {
				t.Fatalf("renew after all: %v, want lease_lost", err)
			}
			s30ReacquireGets(ctx, t, s, 2)
		})
	}
}

// ---------------------------------------------------------------------------
// A renewal at the same backend instant with the same ttl writes bytes
// identical to the record it replaces (a memo hit for its own input): the
// record, its expiry index entry and the reaper stay right.
func TestReviewS30RenewalWritingIdenticalBytes(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)}
	s := openTemp(t, Options{Now: c.Now, ReapInterval: -1})
	acq, err := s30Acquire(ctx, s, testIdentity, "s30-acq-1", time.Minute, lease.Metadata{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	h := s30HolderOf(acq.Lease)
	lockKey := acq.Lease.LockKey
	v0 := storedActive(t, s, lockKey)
	for i := 0; i < 3; i++ {
		ren, err := h.renew(ctx, s, fmt.Sprint("s30-ren-", i), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		s30Scribble(ren.Lease)
		if v := storedActive(t, s, lockKey); !bytes.Equal(v, v0) {
			t.Fatalf("renewal %d at the same instant wrote other bytes (test premise): %q vs %q", i, v, v0)
		}
		s30MemoAgrees(t, s, v0)
	}
	expEntries := func() int {
		n := 0
		_ = s.db.View(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketActiveExp).ForEach(func(k, _ []byte) error { n++; return nil })
		})
		return n
	}
	if n := expEntries(); n != 1 {
		t.Fatalf("%d expiry index entries, want 1", n)
	}
	c.Add(2 * time.Minute)
	if err := s.reap(ctx); err != nil {
		t.Fatal(err)
	}
	if v := storedActive(t, s, lockKey); v != nil {
		t.Fatal("the reaper left the expired lease active")
	}
	if n := expEntries(); n != 0 {
		t.Fatalf("%d expiry index entries after the reap, want 0", n)
	}
	got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: h.leaseID, DeadlineAt: s30Far})
	if err != nil || got.Lease.State != lease.StateExpired || got.Lease.Metadata["k"] != "v" {
		t.Fatalf("inspect after the reap: %+v, %v", got.Lease, err)
	}
	if _, err := h.renew(ctx, s, "s30-ren-late", time.Minute); code(err) != lease.CodeLost {
		t.Fatalf("renew after expiry: %v, want lease_lost", err)
	}
	s30ReacquireGets(ctx, t, s, 2)
}

// ---------------------------------------------------------------------------
// Renewals racing a release: a renewal that starts after the release
// answered is lease_lost, none resurrects the lease, and the store's record
// ends released.
func TestReviewS30RenewalsRacingARelease(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	const rounds, renewers = 12, 6
	for r := 0; r < rounds; r++ {
		acq, err := s30Acquire(ctx, s, testIdentity, fmt.Sprint("s30-acq-", r), time.Minute, lease.Metadata{"round": fmt.Sprint(r)})
		if err != nil {
			t.Fatal(err)
		}
		if acq.Lease.FencingToken != uint64(r+1) {
			t.Fatalf("round %d: token %d", r, acq.Lease.FencingToken)
		}
		h := s30HolderOf(acq.Lease)
		var released atomic.Bool
		var wg sync.WaitGroup
		for g := 0; g < renewers; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; ; i++ {
					after := released.Load()
					res, err := h.renew(ctx, s, fmt.Sprintf("s30-ren-%d-%d-%d", r, g, i), time.Minute)
					switch {
					case err == nil:
						if after {
							t.Errorf("round %d: a renewal started after the release succeeded: %+v", r, res.Lease)
							return
						}
						if res.Lease.LeaseID != h.leaseID || res.Lease.FencingToken != h.token || res.Lease.Metadata["round"] != fmt.Sprint(r) {
							t.Errorf("round %d: renewal answered %+v", r, res.Lease)
						}
						s30Scribble(res.Lease)
					case code(err) == lease.CodeLost:
						return
					default:
						t.Errorf("round %d: renewal: %v", r, err)
						return
					}
				}
			}(g)
		}
		rel, err := h.release(ctx, s, fmt.Sprint("s30-rel-", r))
		released.Store(true)
		wg.Wait()
		if err != nil || rel.Lease.LeaseID != h.leaseID {
			t.Fatalf("round %d: release: %+v, %v", r, rel.Lease, err)
		}
		s30Scribble(rel.Lease)
		if v := storedActive(t, s, acq.Lease.LockKey); v != nil {
			t.Fatalf("round %d: active record after the release: %q", r, v)
		}
		got, err := s.Inspect(ctx, lease.InspectRequest{LeaseID: h.leaseID, DeadlineAt: s30Far})
		if err != nil || got.Lease.State != lease.StateReleased || got.Lease.FencingToken != h.token {
			t.Fatalf("round %d: inspect: %+v, %v", r, got.Lease, err)
		}
	}
}

// ---------------------------------------------------------------------------
// Many goroutines acquire, renew, inspect and release a few identities
// (scribbling on every result): per identity, at most one holder at a time
// and each grant's token exactly one above the last; every renewal and
// release of the true holder succeeds, a stale token never does.
func TestReviewS30ConcurrentFencing(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1})
	const ids, workers, iters = 3, 16, 60
	var mu sync.Mutex
	holder := make([]string, ids)
	last := make([]uint64, ids)
	grants := make([]int, ids)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				n := (w + i) % ids
				id := s30Identity(n)
				acq, err := s30Acquire(ctx, s, id, fmt.Sprintf("s30-acq-%d-%d", w, i), time.Minute, lease.Metadata{"worker": fmt.Sprint(w)})
				if code(err) == lease.CodeConflict {
					insp, err := s.Inspect(ctx, lease.InspectRequest{Identity: id, DeadlineAt: s30Far})
					if err == nil {
						s30Scribble(insp.Lease)
					} else if code(err) != lease.CodeNotFound {
						t.Errorf("inspect: %v", err)
					}
					continue
				}
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				h := s30HolderOf(acq.Lease)
				if acq.Lease.Metadata["worker"] != fmt.Sprint(w) {
					t.Errorf("acquire answered another worker's record: %+v", acq.Lease)
				}
				s30Scribble(acq.Lease)
				mu.Lock()
				if holder[n] != "" {
					t.Errorf("identity %d granted to %s while %s holds it", n, h.leaseID, holder[n])
				}
				if h.token != last[n]+1 {
					t.Errorf("identity %d: token %d after %d", n, h.token, last[n])
				}
				holder[n], last[n] = h.leaseID, h.token
				grants[n]++
				mu.Unlock()

				if h.token > 1 {
					stale := h
					stale.token--
					if _, err := stale.renew(ctx, s, fmt.Sprintf("s30-stale-%d-%d", w, i), time.Minute); code(err) != lease.CodeLost {
						t.Errorf("renew with a stale token: %v, want lease_lost", err)
					}
				}
				ren, err := h.renew(ctx, s, fmt.Sprintf("s30-ren-%d-%d", w, i), 2*time.Minute)
				if err != nil || ren.Lease.LeaseID != h.leaseID || ren.Lease.FencingToken != h.token || ren.Lease.Metadata["worker"] != fmt.Sprint(w) {
					t.Errorf("renew by the holder: %+v, %v", ren.Lease, err)
				} else {
					s30Scribble(ren.Lease)
				}
				insp, err := s.Inspect(ctx, lease.InspectRequest{Identity: id, DeadlineAt: s30Far})
				if err != nil || insp.Lease.LeaseID != h.leaseID || insp.Lease.FencingToken != h.token {
					t.Errorf("inspect while holding: %+v, %v", insp.Lease, err)
				} else {
					s30Scribble(insp.Lease)
				}

				mu.Lock()
				holder[n] = ""
				mu.Unlock()
				rel, err := h.release(ctx, s, fmt.Sprintf("s30-rel-%d-%d", w, i))
				if err != nil || rel.Lease.LeaseID != h.leaseID || rel.Lease.FencingToken != h.token {
					t.Errorf("release by the holder: %+v, %v", rel.Lease, err)
					return
				}
				s30Scribble(rel.Lease)
			}
		}(w)
	}
	wg.Wait()
	total := 0
	for n := 0; n < ids; n++ {
		lockKey := s30Holder{id: s30Identity(n), instance: "instance-1", caller: lease.Caller{PrincipalID: "prn-actor"}}.lockKey(t)
		c, err := (faults{s}).Counter(ctx, lockKey)
		if err != nil || c != uint64(grants[n]) || c != last[n] {
			t.Errorf("identity %d: counter %d (%v), %d grants, last token %d", n, c, err, grants[n], last[n])
		}
		if v := storedActive(t, s, lockKey); v != nil {
			t.Errorf("identity %d: active record left: %q", n, v)
		}
		total += grants[n]
	}
	if total < ids {
		t.Fatalf("%d grants in all, fewer than identities", total)
	}
	t.Logf("grants per identity: %v", grants)
}
