package lease

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func sampleEmbedding(r *Record) EmbeddedEvidence {
	return EmbeddedEvidence{Digest: strings.Repeat("0123456789abcdef", 4),
		Scope: IdempotencyScope(OpAcquire, r.LockKey, r.OwnerPrincipalID, r.RequestID), TTLMs: 40000}
}

// A version 3 record is version 2 behind three evidence lines; it decodes
// back to the same record and evidence, and its acquisition's evidence is
// the lease as granted: renewed_at and backend time its acquired_at, the
// acquisition's ttl_ms and the expires_at it gave.
func TestRecordV3RoundTrip(t *testing.T) {
	r := validRecord()
	for _, ttl := range []int64{r.TTLMs, 40000} {
		e := sampleEmbedding(r)
		e.TTLMs = ttl
		raw, err := EmbeddingRecord(r, e)
		if err != nil {
			t.Fatal(err)
		}
		v2, _ := CompactRecord(r)
		line := ""
		if ttl != r.TTLMs {
			line = "40000"
		}
		want := RecordV3Prefix + e.Digest + "\n" + e.Scope + "\n" + line + "\n" + string(v2[len(RecordV2Prefix):])
		if string(raw) != want {
			t.Fatalf("rv3 bytes:\n got  %q\n want %q", raw, want)
		}
		got, ge, err := DecodeEmbeddingRecord(raw)
		if err != nil || !reflect.DeepEqual(normMeta(got), normMeta(r)) || ge == nil || *ge != e {
			t.Fatalf("decode: %+v %+v %v", got, ge, err)
		}
		if rec, err := DecodeAnyStoredRecord(raw); err != nil || !reflect.DeepEqual(normMeta(rec), normMeta(r)) {
			t.Fatalf("DecodeAnyStoredRecord: %v", err)
		}
		evRaw, err := ge.Acquisition(got)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := DecodeIdempotencyRecord(evRaw)
		if err != nil {
			t.Fatal(err)
		}
		l := ev.Lease
		if ev.Op != OpAcquire || ev.Code != CodeAcquired || ev.Digest != e.Digest || ev.BackendTime.UnixMilli() != r.AcquiredAt.UnixMilli() ||
			l.RenewedAt.UnixMilli() != r.AcquiredAt.UnixMilli() || l.TTLMs != ttl || l.ExpiresAt.UnixMilli() != r.AcquiredAt.UnixMilli()+ttl ||
			l.State != StateActive || l.LeaseID != r.LeaseID || l.FencingToken != r.FencingToken {
			t.Fatalf("acquisition evidence: %+v %+v", ev, l)
		}
	}
	// Records of the other versions decode as before, without evidence.
	for _, enc := range []func(*Record) ([]byte, error){(*Record).Encode, CompactRecord} {
		raw, _ := enc(r)
		if got, e, err := DecodeEmbeddingRecord(raw); err != nil || e != nil || !reflect.DeepEqual(normMeta(got), normMeta(r)) {
			t.Fatalf("other version: %+v %v %v", got, e, err)
		}
	}
}

// Every damage of a version 3 record is corrupt: never a guess. A format
// 3 reader (DecodeStoredRecord) refuses version 3 as corrupt too.
func TestRecordV3StrictDecode(t *testing.T) {
	r := validRecord()
	e := sampleEmbedding(r)
	good, err := EmbeddingRecord(r, e)
	if err != nil {
		t.Fatal(err)
	}
	g := string(good)
	nl := strings.IndexByte(g[4:], '\n') + 4
	cases := map[string]string{
		"truncated":         g[:len(g)-3],
		"truncated head":    g[:80],
		"no lines":          RecordV3Prefix,
		"digest upper":      strings.Replace(g, "0123456789abcdef", "0123456789ABCDEF", 1),
		"digest short":      RecordV3Prefix + e.Digest[1:] + g[nl:],
		"digest not hex":    RecordV3Prefix + "z" + e.Digest[1:] + g[nl:],
		"scope short":       strings.Replace(g, e.Scope, e.Scope[1:], 1),
		"scope bad byte":    strings.Replace(g, e.Scope, "+"+e.Scope[1:], 1),
		"scope padded":      strings.Replace(g, e.Scope, e.Scope[1:]+"=", 1),
		"ttl leading zero":  strings.Replace(g, "\n40000\n", "\n040000\n", 1),
		"ttl equal to own":  strings.Replace(g, "\n40000\n", "\n30000\n", 1),
		"ttl zero":          strings.Replace(g, "\n40000\n", "\n0\n", 1),
		"ttl not a number":  strings.Replace(g, "\n40000\n", "\n4e4\n", 1),
		"ttl above max":     strings.Replace(g, "\n40000\n", "\n86400001\n", 1),
		"extra line":        strings.Replace(g, "\n40000\n", "\n40000\n\n", 1),
		"extra line at end": g + "\nx",
		"missing ttl line":  strings.Replace(g, "\n40000\n", "\n", 1),
		"ended state":       strings.Replace(g, "\nactive\n", "\nreleased\n", 1),
		"rv2 part damaged":  strings.Replace(g, "\n42\n", "\n042\n", 1),
	}
	for name, raw := range cases {
		if raw == g {
			t.Fatalf("%s: the damage changed nothing", name)
		}
		if _, _, err := DecodeEmbeddingRecord([]byte(raw)); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: %v, want corrupt", name, err)
		}
	}
	if _, err := DecodeStoredRecord(good); CodeOf(err) != CodeCorrupt {
		t.Fatalf("a format 3 reader on version 3: %v, want corrupt", err)
	}
	// Nothing a reader refuses is written.
	for name, bad := range map[string]EmbeddedEvidence{
		"digest": {Digest: "x", Scope: e.Scope, TTLMs: 1}, "scope": {Digest: e.Digest, Scope: "a/b", TTLMs: 1},
		"ttl": {Digest: e.Digest, Scope: e.Scope, TTLMs: 0},
	} {
		if _, err := EmbeddingRecord(r, bad); err == nil {
			t.Errorf("%s: a malformed embedding was encoded", name)
		}
	}
	ended := r.Clone()
	ended.State = StateReleased
	if _, err := EmbeddingRecord(ended, e); err == nil {
		t.Error("an ended record was encoded in version 3")
	}
	if !bytes.HasPrefix(good, []byte(RecordV3Prefix)) {
		t.Fatal("no version 3 prefix")
	}
}
