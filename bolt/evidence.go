package bolt

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/lease"
)

// Idempotency evidence is stored in one of two forms under idemKey:
//
//   - full: lease.IdempotencyRecord's canonical JSON (it starts with '{'),
//     the only form before schema 3 and the form of any evidence whose
//     record has no base to refer to;
//   - reference (refTag first): the evidence without its record. The
//     record is the lease's own record — its active record, or its history
//     entry once it ended — with the four fields a lease changes over its
//     life (renewed_at, expires_at, ttl_ms, state) as they were, and the
//     SHA-256 of the original record's encoding, which the rebuilt record
//     must match exactly.
//
// A reference is about a fifth of the full form, and the evidence of every
// mutation of a lease otherwise carries its record once more beside the
// active record and the history entry. While a reference exists its lease's
// record must: each reference has an entry refKey, and a history entry
// about to be forgotten (trimmed or retired) first turns the references to
// its lease back into full evidence (expandRefs). Active records are only
// ever removed by archiving them into history. The price: a record damaged
// on disk fails the replays of its lease's requests closed, as corrupt,
// where full evidence would still have answered them.
const refTag = 0x02

// refBody is the decoded reference form.
type refBody struct {
	op         lease.Op
	digest     [32]byte
	code       lease.Code
	backendMs  int64
	leaseID    string
	token      uint64
	renewedMs  int64
	expiresMs  int64
	ttlMs      int64
	state      lease.State
	recordHash [32]byte
}

var errRefMalformed = errors.New("reference evidence is malformed")

// refKey marks the evidence of scope as referring to leaseID's record:
// lock key ‖ 0 ‖ 'r' ‖ lease id ‖ 0 ‖ scope.
func refKey(lockKey, leaseID, scope string) []byte {
	k := identKey(lockKey, kindRef, leaseID)
	k = append(k, 0)
	return append(k, scope...)
}

func refPrefix(lockKey, leaseID string) []byte {
	return append(identKey(lockKey, kindRef, leaseID), 0)
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeRef returns the reference form of ev, or nil when the record
// cannot be rebuilt from itself exactly (then the full form is stored).
func encodeRef(ev *lease.IdempotencyRecord, recordBytes []byte) []byte {
	r := ev.Lease
	digest, ok := hexDigest(ev.Digest)
	if !ok {
		return nil
	}
	b := make([]byte, 0, 224)
	b = append(b, refTag)
	b = appendStr(b, string(ev.Op))
	b = append(b, digest[:]...)
	b = appendStr(b, string(ev.Code))
	b = binary.BigEndian.AppendUint64(b, uint64(ev.BackendTime.UnixMilli()))
	b = appendStr(b, r.LeaseID)
	b = binary.BigEndian.AppendUint64(b, r.FencingToken)
	b = binary.BigEndian.AppendUint64(b, uint64(r.RenewedAt.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(r.ExpiresAt.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(r.TTLMs))
	b = appendStr(b, string(r.State))
	sum := sha256.Sum256(recordBytes)
	b = append(b, sum[:]...)
	// Only a form that rebuilds the very record is kept: the rebuild takes
	// the record's own other fields and these, exact to the millisecond.
	for _, ts := range []lease.Timestamp{ev.BackendTime, r.RenewedAt, r.ExpiresAt} {
		if !ts.Time().Equal(time.UnixMilli(ts.UnixMilli())) {
			return nil
		}
	}
	if _, err := decodeRef(b); err != nil {
		return nil
	}
	return b
}

func hexDigest(s string) ([32]byte, bool) {
	var d [32]byte
	if len(s) != 64 {
		return d, false
	}
	for i := 0; i < 32; i++ {
		hi, ok1 := unhex(s[2*i])
		lo, ok2 := unhex(s[2*i+1])
		if !ok1 || !ok2 {
			return d, false
		}
		d[i] = hi<<4 | lo
	}
	return d, true
}

// unhex accepts lowercase hex only: digests are written lowercase, so a
// digest in any other spelling would not round-trip.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

const hexDigits = "0123456789abcdef"

func digestHex(d [32]byte) string {
	out := make([]byte, 64)
	for i, c := range d {
		out[2*i], out[2*i+1] = hexDigits[c>>4], hexDigits[c&0xf]
	}
	return string(out)
}

// decodeRef strictly decodes the reference form: every byte accounted
// for, no trailing data.
func decodeRef(b []byte) (*refBody, error) {
	if len(b) == 0 || b[0] != refTag {
		return nil, errRefMalformed
	}
	rd := refReader{b: b[1:]}
	var r refBody
	r.op = lease.Op(rd.str())
	copy(r.digest[:], rd.fixed(32))
	r.code = lease.Code(rd.str())
	r.backendMs = int64(rd.u64())
	r.leaseID = rd.str()
	r.token = rd.u64()
	r.renewedMs = int64(rd.u64())
	r.expiresMs = int64(rd.u64())
	r.ttlMs = int64(rd.u64())
	r.state = lease.State(rd.str())
	copy(r.recordHash[:], rd.fixed(32))
	if rd.bad || len(rd.b) != 0 || !r.op.Valid() || !r.code.Success() || !r.state.Valid() || r.leaseID == "" {
		return nil, errRefMalformed
	}
	return &r, nil
}

type refReader struct {
	b   []byte
	bad bool
}

// fixed reads n bytes, or a uvarint-prefixed run when n < 0.
func (r *refReader) fixed(n int) []byte {
	if r.bad {
		return nil
	}
	if n < 0 {
		v, k := binary.Uvarint(r.b)
		if k <= 0 || v > uint64(len(r.b)-k) {
			r.bad = true
			return nil
		}
		r.b, n = r.b[k:], int(v)
	}
	if n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *refReader) str() string { return string(r.fixed(-1)) }

func (r *refReader) u64() uint64 {
	v := r.fixed(8)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// rebuild returns the full evidence from base, the lease's record now (any
// version of it), or an error if base is not the lease or the rebuilt
// record is not exactly the original.
func (r *refBody) rebuild(base *lease.Record) (*lease.IdempotencyRecord, error) {
	if base == nil || base.LeaseID != r.leaseID || base.FencingToken != r.token {
		return nil, errRefMalformed
	}
	rec := base.Clone()
	rec.RenewedAt, rec.ExpiresAt = lease.UnixMilli(r.renewedMs), lease.UnixMilli(r.expiresMs)
	rec.TTLMs, rec.State = r.ttlMs, r.state
	raw, err := rec.Encode()
	if err != nil || sha256.Sum256(raw) != r.recordHash {
		return nil, errRefMalformed
	}
	ev := &lease.IdempotencyRecord{Version: lease.IdempotencyVersion, Op: r.op, Digest: digestHex(r.digest),
		Code: r.code, Lease: rec, BackendTime: lease.UnixMilli(r.backendMs)}
	if _, err := ev.Encode(); err != nil { // the same invariants the full form is held to
		return nil, errRefMalformed
	}
	return ev, nil
}

// loadEvidence decodes the evidence stored at k of lockKey, in either
// form, rebuilding a reference from its lease's record.
func loadEvidence(tx *bbolt.Tx, lockKey string, v []byte) (*lease.IdempotencyRecord, error) {
	if len(v) == 0 || v[0] != refTag {
		return lease.DecodeIdempotencyRecord(v)
	}
	ref, err := decodeRef(v)
	if err != nil {
		return nil, err
	}
	return ref.rebuild(leaseRecord(tx, lockKey, ref.leaseID))
}

// leaseRecord is leaseID's record: active, else its history entry's; nil
// if neither holds.
func leaseRecord(tx *bbolt.Tx, lockKey, leaseID string) *lease.Record {
	if v := tx.Bucket(bucketIdent).Get(activeKey(lockKey)); v != nil {
		if rec, err := lease.DecodeRecord(v); err == nil && rec.LeaseID == leaseID {
			return rec
		}
	}
	if h := findHistory(tx, lockKey, leaseID); h != nil {
		return h.Record
	}
	return nil
}

// putEvidence stores ev under scope of lockKey, by reference where it can.
func putEvidence(tx *bbolt.Tx, lockKey, scope string, ev *lease.IdempotencyRecord) ([]byte, error) {
	ident := tx.Bucket(bucketIdent)
	k := idemKey(lockKey, scope)
	if raw, err := ev.Lease.Encode(); err == nil {
		if ref := encodeRef(ev, raw); ref != nil {
			if err := ident.Put(refKey(lockKey, ev.Lease.LeaseID, scope), nil); err != nil {
				return nil, err
			}
			return k, ident.Put(k, ref)
		}
	}
	b, err := ev.Encode()
	if err != nil {
		return nil, err
	}
	return k, ident.Put(k, b)
}

// expandRefs turns every reference to rec's lease back into full evidence,
// before rec's last copy (its history entry) goes.
func expandRefs(tx *bbolt.Tx, rec *lease.Record) error {
	ident := tx.Bucket(bucketIdent)
	prefix := refPrefix(rec.LockKey, rec.LeaseID)
	var refs [][]byte
	c := ident.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		refs = append(refs, bytes.Clone(k))
	}
	for _, rk := range refs {
		ek := idemKey(rec.LockKey, string(rk[len(prefix):]))
		if v := ident.Get(ek); len(v) > 0 && v[0] == refTag {
			if ref, err := decodeRef(v); err == nil {
				if ev, err := ref.rebuild(rec); err == nil {
					b, err := ev.Encode()
					if err != nil {
						return err
					}
					if err := ident.Put(ek, b); err != nil {
						return err
					}
				}
			}
		}
		if err := ident.Delete(rk); err != nil {
			return err
		}
	}
	return nil
}

// dropEvidence deletes the evidence at ident key k and its reference mark.
func dropEvidence(tx *bbolt.Tx, k []byte) error {
	ident := tx.Bucket(bucketIdent)
	if v := ident.Get(k); len(v) > 0 && v[0] == refTag {
		if lockKey, kind, ok := splitIdentKey(k); ok && kind == kindIdem {
			if ref, err := decodeRef(v); err == nil {
				scope := string(k[len(lockKey)+2:])
				if err := ident.Delete(refKey(lockKey, ref.leaseID, scope)); err != nil {
					return err
				}
			}
		}
	}
	return ident.Delete(k)
}
