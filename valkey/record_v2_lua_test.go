package valkey

import (
	"fmt"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// decodeCheck is added to a test copy of the library: the verdict of the
// library's strict decode on the bytes in ARGV 1 under the lock key in
// ARGV 2 and the tuple in ARGV 3..9, as the mutations read the active
// record (memo bypassed): 'ok' or why not.
const decodeCheck = `
local function decode_check(keys, args)
  local known = REC_OF[args[1]]
  REC_OF[args[1]] = nil
  local r, why = decode(args[1], args[2], args, 3)
  REC_OF[args[1]] = known
  if r then return 'ok' end
  return why
end
redis.register_function { function_name = FN .. 'decode_check', callback = decode_check, flags = { 'no-writes' } }
`

// libraryVerdict is decodeCheck's verdict on b read as the record of lease
// l (its lock key and tuple): "ok" or why not.
func libraryVerdict(t *testing.T, s *Store, l *lease.Record, b string) string {
	t.Helper()
	id := l.Identity()
	v, err := s.client.Do(bg, s.build(call{fn: "decode_check", ro: true, args: []string{b, l.LockKey,
		id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass}})).ToString()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rv2Corruptions are damaged copies of a version 2 record: each line
// emptied, padded, signed, zero-led, cased, cut by a carriage return or a
// quote, holding '..' or an API key's prefix; lines added, lost, swapped;
// numbers out of range or not canonical; metadata that is not one
// canonical object; another tag.
func rv2Corruptions(raw string) map[string]string {
	lines := strings.Split(raw, "\n")
	meta := len(lines) - 1 // metadata is last; it has no newline here
	out := map[string]string{}
	with := func(i int, v string) string {
		c := append([]string(nil), lines...)
		c[i] = v
		return strings.Join(c, "\n")
	}
	for i, v := range lines {
		for name, w := range map[string]string{
			"empty": "", "suffix": v + "0", "zero_led": "0" + v, "space": v + " ", "signed": "-" + v, "plus": "+" + v,
			"cr": v + "\r", "quote": v + `"`, "backslash": v + `\`, "upper": strings.ToUpper(v), "tab": "\t" + v,
			"exp": v + "e0", "dot": v + ".0", "hex": "0x" + v, "nul": v + "\x00", "del": v + "\x7f",
			"dotdot": v + "..x", "api_key": v + "_star_sk_x", "api_key_upper": v + "_STAR_SK_x",
		} {
			out[fmt.Sprintf("line%d_%s", i, name)] = with(i, w)
		}
	}
	join := func(ls []string) string { return strings.Join(ls, "\n") }
	out["extra_line"] = join(append(append(append([]string(nil), lines[:meta]...), "x"), lines[meta:]...))
	out["lost_line"] = join(append(append([]string(nil), lines[:meta-1]...), lines[meta]))
	out["swapped_ids"] = with(10, lines[11])
	out["trailing_newline"] = raw + "\n"
	out["leading_newline"] = "\n" + raw
	out["prefix_only"] = lease.RecordV2Prefix
	out["no_prefix_newline"] = strings.TrimSuffix(lease.RecordV2Prefix, "\n") + strings.TrimPrefix(raw, "rv2")
	for name, w := range map[string]string{
		"token_zero": "0", "token_2p53": "9007199254740992", "token_max": "9007199254740991", "token_17_digits": "10000000000000000",
	} {
		out[name] = with(14, w)
	}
	out["renewed_before_acquired"] = with(16, "1")
	out["expires_before_renewed"] = with(17, "2")
	out["ttl_zero"] = with(18, "0")
	out["ttl_past_max"] = with(18, "86400001")
	out["lifetime_past_max"] = with(19, "604800001")
	out["year_10000"] = with(17, "253402300800000")
	for name, m := range map[string]string{
		"array": "[]", "string": `"x"`, "spaced": `{ }`, "newline_inside": "{\n}", "trailing_space": "{} ", "two": "{}{}",
		"not_json": "{", "null": "null", "nested": `{"a":{"b":[1,2,{"c":null}]}}`, "unsorted": `{"b":1,"a":2}`,
		"escaped": `{"a":"\u00e9"}`, "big": `{"a":` + strings.Repeat("1", 5000) + `}`,
	} {
		out["meta_"+name] = with(meta, m)
	}
	for _, st := range []string{"active", "expired", "released", "revoked", "Active", "ended", ""} {
		out["state_"+st] = with(meta-1, st)
	}
	out["other_tag"] = with(1, strings.Repeat("A", 43))
	return out
}

// The library's version 2 record decoding gives the verdict its version 1
// decoding gives on the same record rebuilt (lease.ExpandRecord), and
// never refuses what Go reads (lease.DecodeStoredRecord), on every damaged
// copy of a stored record. Like version 1, it leaves one check to Go: that
// metadata is canonical JSON of scalars (Go decodes every record the
// library returns, so such a record is answered as corrupt).
func TestRecordV2DecodingAgreesWithGo(t *testing.T) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: true})
	withTestFunctions(t, s, decodeCheck, "starlease_decode_check", "sldc_")
	for _, meta := range []lease.Metadata{nil, {"purpose": `quote " backslash \ <tag> & ünïcödé`, "nl": "x\ny"}} {
		req := acquireReq(newIdentity())
		req.Metadata = meta
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := get(t, s, s.keys.active(tagOf(a.Lease.LockKey)))
		if !strings.HasPrefix(raw, lease.RecordV2Prefix) {
			t.Fatalf("not stored in version 2: %.40q", raw)
		}
		verdict := func(b string) string { return libraryVerdict(t, s, a.Lease, b) }
		if v := verdict(raw); v != "ok" {
			t.Fatalf("the stored record itself: %q", v)
		}
		accepted, refused, goOnly := 0, 0, 0
		for name, bad := range rv2Corruptions(raw) {
			v2 := verdict(bad)
			v1 := "not rebuilt"
			if exp, ok := lease.ExpandRecord(bad); ok && strings.HasPrefix(bad, lease.RecordV2Prefix) {
				v1 = verdict(exp)
			}
			rec, gerr := lease.DecodeStoredRecord([]byte(bad))
			goOK := gerr == nil && rec.LockKey == a.Lease.LockKey
			switch {
			case (v2 == "ok") != (v1 == "ok") && strings.HasPrefix(bad, lease.RecordV2Prefix):
				t.Errorf("%s: version 2 says %q, version 1 rebuilt %q\n%q", name, v2, v1, bad)
			case goOK && v2 != "ok":
				t.Errorf("%s: the library refuses what Go reads: %q\n%q", name, v2, bad)
			case v2 == "ok" && !goOK:
				goOnly++
				if !strings.HasPrefix(bad, raw[:strings.LastIndexByte(raw, '\n')+1]) {
					t.Errorf("%s: the library reads what Go refuses (%v), not for its metadata\n%q", name, gerr, bad)
				}
			}
			if v2 == "ok" {
				accepted++
			} else {
				refused++
			}
		}
		// Some damage leaves a valid record (an id one character longer);
		// most does not.
		if accepted == 0 || refused < 3*accepted {
			t.Fatalf("%d corruptions accepted (%d of them refused by Go for their metadata), %d refused", accepted, goOnly, refused)
		}
	}
}
