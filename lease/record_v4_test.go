package lease

import (
	"strconv"
	"strings"
	"testing"
)

// leanShapes are active records whose version 4 forms use each
// shortening and each spelled-out case: renewed or not, the derived
// expiry (plain or capped by the maximum lifetime) or another one, the
// acquisition's ttl the record's or not, metadata or none.
func leanShapes() map[string]func(r *Record, e *EmbeddedEvidence) {
	return map[string]func(r *Record, e *EmbeddedEvidence){
		"renewed": func(r *Record, e *EmbeddedEvidence) {},
		// An id with the prefix but no ULID after it.
		"short_id": func(r *Record, e *EmbeddedEvidence) { r.LeaseID = "lease_01" },
		"not_renewed": func(r *Record, e *EmbeddedEvidence) {
			r.RenewedAt, r.ExpiresAt = r.AcquiredAt, UnixMilli(msAcquired+r.TTLMs)
		},
		"capped": func(r *Record, e *EmbeddedEvidence) {
			r.MaximumLifetimeMs, r.ExpiresAt = 40_000, UnixMilli(msAcquired+40_000)
		},
		"other_expiry": func(r *Record, e *EmbeddedEvidence) { r.ExpiresAt = UnixMilli(msAcquired + 45_000) },
		"same_ttl":     func(r *Record, e *EmbeddedEvidence) { e.TTLMs = r.TTLMs },
		"metadata": func(r *Record, e *EmbeddedEvidence) {
			r.Metadata = Metadata{"purpose": `quote " backslash \ <tag> & ünïcödé`, "nl": "x\ny", "n": 1.5}
		},
	}
}

// Version 4 is version 3 without the tag, state and derivable times, the
// digest in base64url; it decodes, under its lock key, to the same record
// and evidence, and it is shorter by at least the tag and state lines.
func TestRecordV4RoundTrip(t *testing.T) {
	for name, shape := range leanShapes() {
		t.Run(name, func(t *testing.T) {
			r := leanRecord()
			e := sampleEmbedding(r)
			shape(r, &e)
			v3, err := EmbeddingRecord(r, e)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := LeanRecord(r, e)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(raw), "\n")
			if len(lines) != rv4Lines || lines[0] != "rv4" || len(lines[rv4Digest]) != 43 || lines[rv4Scope] != e.Scope {
				t.Fatalf("version 4 lines: %q", raw)
			}
			if d, ok := leanDigest(lines[rv4Digest]); !ok || d != e.Digest {
				t.Fatalf("digest line %q is not %s", lines[rv4Digest], e.Digest)
			}
			wantRenewed, wantExpires := "20000", ""
			switch name {
			case "not_renewed":
				wantRenewed = ""
			case "other_expiry":
				wantExpires = "45000"
			}
			if got := lines[rv4Facts+factRenewed]; got != wantRenewed {
				t.Fatalf("renewed line %q, want %q", got, wantRenewed)
			}
			if got := lines[rv4Facts+factExpires]; got != wantExpires {
				t.Fatalf("expires line %q, want %q", got, wantExpires)
			}
			if got := lines[rv4Facts+factLeaseID]; LeaseIDPrefix+got != r.LeaseID || got == r.LeaseID {
				t.Fatalf("lease id line %q for %q", got, r.LeaseID)
			}
			if got := lines[rv4Tag]; got != lockKeyTag(r) {
				t.Fatalf("tag line %q", got)
			}
			if meta := lines[rv4Lines-1]; (meta == "") != (name != "metadata") {
				t.Fatalf("metadata line %q", meta)
			}
			if strings.Contains(string(raw), "\nactive\n") {
				t.Fatalf("version 4 holds the state: %q", raw)
			}
			if saved := len(v3) - len(raw); saved < len("active\n")+21+len(LeaseIDPrefix)+12 {
				t.Fatalf("version 4 saves only %d bytes", saved)
			}
			got, ge, err := DecodeEmbeddingRecordAt(raw, r.LockKey)
			if err != nil || !sameEncoding(got, r) || ge == nil || *ge != e {
				t.Fatalf("decode: %+v %+v %v", got, ge, err)
			}
			if back, ok := ExpandLeanRecord(string(raw), r.LockKey); !ok || back != string(v3) {
				t.Fatalf("expanded:\n got  %q\n want %q", back, v3)
			}
			// Without the lock key of its own key, or under another's, it
			// is corrupt: its tuple hashes to its own.
			for _, lk := range []string{"", KeyPrefix, "other:" + lockKeyTag(r), KeyPrefix + strings.Repeat("A", 43)} {
				if _, _, err := DecodeEmbeddingRecordAt(raw, lk); err == nil || AsError(err).Code != CodeCorrupt {
					t.Fatalf("under lock key %q: %v", lk, err)
				}
			}
		})
	}
	// Records of the other versions decode as before, under any lock key.
	r := leanRecord()
	v3, _ := EmbeddingRecord(r, sampleEmbedding(r))
	for _, enc := range []func(*Record) ([]byte, error){(*Record).Encode, CompactRecord,
		func(*Record) ([]byte, error) { return v3, nil }} {
		raw, _ := enc(r)
		if got, _, err := DecodeEmbeddingRecordAt(raw, ""); err != nil || !sameEncoding(got, r) {
			t.Fatalf("other version: %+v %v", got, err)
		}
	}
}

// A record version 4 cannot hold is refused, not written another way: one
// that is not active, or whose evidence is malformed.
func TestRecordV4Refuses(t *testing.T) {
	r := leanRecord()
	e := sampleEmbedding(r)
	ended := r.Clone()
	ended.State = StateReleased
	if _, err := LeanRecord(ended, e); err == nil {
		t.Fatal("an ended record has a version 4 form")
	}
	bad := e
	bad.Digest = strings.ToUpper(e.Digest)
	if _, err := LeanRecord(r, bad); err == nil {
		t.Fatal("an upper-case digest has a version 4 form")
	}
	for _, id := range []string{"other_01", "Lease_01", "LEASE_01", "lease01", "xlease_01", "other_" + r.LeaseID[6:]} {
		foreign := r.Clone()
		foreign.LeaseID = id
		if _, err := LeanRecord(foreign, e); err == nil {
			t.Fatalf("lease id %q (not the prefix) has a version 4 form", id)
		}
	}
}

// Every damage of a version 4 record is either corrupt or another record
// whose version 4 form is exactly the damaged bytes (an id one character
// longer): never a second spelling of a record. The shortenings' other
// spellings are each refused.
func TestRecordV4StrictDecode(t *testing.T) {
	for name, shape := range leanShapes() {
		r := leanRecord()
		e := sampleEmbedding(r)
		shape(r, &e)
		good, err := LeanRecord(r, e)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(good), "\n")
		with := func(i int, v string) string {
			c := append([]string(nil), lines...)
			c[i] = v
			return strings.Join(c, "\n")
		}
		cases := map[string]string{
			"truncated":                string(good[:len(good)-3]),
			"no_lines":                 RecordV4Prefix,
			"trailing_nl":              string(good) + "\n",
			"state_line":               strings.Join(append(append(append([]string(nil), lines[:rv4Lines-1]...), "active"), lines[rv4Lines-1]), "\n"),
			"tag_line":                 strings.Join(append(append(append([]string(nil), lines[:rv4Tuple]...), lockKeyTag(r)), lines[rv4Tuple:]...), "\n"),
			"hex_digest":               with(rv4Digest, e.Digest),
			"padded_digest":            with(rv4Digest, lines[rv4Digest]+"="),
			"std_b64_digest":           with(rv4Digest, strings.NewReplacer("-", "+", "_", "/").Replace(lines[rv4Digest])),
			"renewed_zero":             with(rv4Facts+factRenewed, "0"),
			"renewed_spelled_absolute": with(rv4Facts+factRenewed, lines[rv4Facts+factAcquired]),
			"expires_derived_spelled":  with(rv4Facts+factExpires, strconv.FormatInt(r.ExpiresAt.UnixMilli()-msAcquired, 10)),
			"expires_negative":         with(rv4Facts+factExpires, "-1"),
			"ttl_spelled":              with(rv4TTL, strconv.FormatInt(r.TTLMs, 10)),
			"v3_head":                  "rv3" + string(good[3:]),
			"lease_id_prefixed":        with(rv4Facts+factLeaseID, r.LeaseID),
			"tag_other":                with(rv4Tag, strings.Repeat("A", 43)),
			"tag_short":                with(rv4Tag, lockKeyTag(r)[:42]),
			"tag_first_8":              with(rv4Tag, lockKeyTag(r)[:8]),
			"tag_empty":                with(rv4Tag, ""),
			"acquired_plus":            with(rv4Facts+factAcquired, "+"+lines[rv4Facts+factAcquired]),
			"acquired_negative":        with(rv4Facts+factAcquired, "-3"),
			"acquired_absolute":        with(rv4Facts+factAcquired, strconv.FormatInt(msAcquired, 10)),
			"meta_braces":              with(rv4Lines-1, "{}"),
		}
		// The last digest character's 2 low bits are padding: each other
		// value of them is another spelling of the same digest.
		for i, c := range otherPaddings(lines[rv4Digest][42]) {
			cases["digest_padding_"+strconv.Itoa(i)] = with(rv4Digest, lines[rv4Digest][:42]+string(c))
		}
		for i, v := range lines {
			for dn, w := range map[string]string{"empty": "", "suffix": v + "0", "zero_led": "0" + v, "space": v + " ",
				"signed": "+" + v, "cr": v + "\r", "upper": strings.ToUpper(v)} {
				cases[strconv.Itoa(i)+"_"+dn] = with(i, w)
			}
		}
		for cn, bad := range cases {
			if bad == string(good) {
				continue
			}
			got, ge, err := DecodeEmbeddingRecordAt([]byte(bad), r.LockKey)
			if err == nil {
				again, lerr := LeanRecord(got, *ge)
				if lerr != nil || string(again) != bad {
					t.Errorf("%s/%s: accepted as a record whose version 4 form differs:\n %q\n %q", name, cn, bad, again)
				}
				continue
			}
			if AsError(err).Code != CodeCorrupt {
				t.Errorf("%s/%s: %v, want corrupt", name, cn, err)
			}
		}
		for _, cn := range []string{"tag_other", "tag_short", "tag_first_8", "tag_empty", "acquired_plus", "acquired_negative",
			"digest_padding_0", "digest_padding_1", "digest_padding_2", "truncated", "no_lines", "trailing_nl", "state_line", "tag_line", "hex_digest", "padded_digest",
			"renewed_zero", "expires_derived_spelled", "expires_negative", "ttl_spelled", "v3_head"} {
			if _, _, err := DecodeEmbeddingRecordAt([]byte(cases[cn]), r.LockKey); err == nil && cases[cn] != string(good) {
				t.Errorf("%s/%s: accepted", name, cn)
			}
		}
	}
}

// sameEncoding reports records with the same version 1 bytes (metadata
// numbers decode to another type than a test writes).
func sameEncoding(a, b *Record) bool {
	ea, erra := a.Encode()
	eb, errb := b.Encode()
	return erra == nil && errb == nil && string(ea) == string(eb)
}

// otherPaddings are the base64url characters with last's 4 high bits and
// other 2 low bits: as a digest's last character, other spellings of it.
func otherPaddings(last byte) []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	v := strings.IndexByte(alphabet, last) &^ 3
	var out []byte
	for p := range 4 {
		if alphabet[v+p] != last {
			out = append(out, alphabet[v+p])
		}
	}
	return out
}

// leanRecord is validRecord with a lease id NewLeaseID gives.
func leanRecord() *Record {
	r := validRecord()
	r.LeaseID = NewLeaseID(UnixMilli(msAcquired - 3))
	return r
}
