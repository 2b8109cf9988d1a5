package valkey

import (
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/lease/leasetest"
)

// memoCheck is appended to a test copy of the library: it reports whether
// the library's memo holds the active record's bytes and, if so, whether a
// full strict decode of those bytes (memo bypassed) gives the same record.
const memoCheck = `
local function memo_check(keys, args)
  local raw = redis.call('GET', keys[1])
  if not raw then return 'no record' end
  local known = REC_OF[raw]
  if not known then return 'absent' end
  REC_OF[raw] = nil
  local d, why = decode(raw, known.lock_key, nil)
  REC_OF[raw] = known
  if not d then return 'decode refuses the remembered bytes: ' .. why end
  for _, f in ipairs(FIELDS) do
    if d[f[1]] ~= known[f[1]] then return 'field ' .. f[1] .. ' differs' end
  end
  if d.metadata ~= known.metadata or d.state ~= known.state then return 'metadata or state differs' end
  local n = 0
  for _ in pairs(known) do n = n + 1 end
  if n ~= #FIELDS + 2 then return 'remembered record has other fields' end
  return 'same'
end
redis.register_function { function_name = FN .. 'memo_check', callback = memo_check, flags = { 'no-writes' } }
`

// Every record the library remembers when writing it is exactly what a
// full strict decode of its bytes gives, for each kind of writer and for
// metadata that needs escaping.
// withTestFunctions makes s call a copy of the library with extra Lua
// (test functions, which see the library's locals) added, under its own
// library name and function prefix.
func withTestFunctions(t *testing.T, s *Store, extra, name, prefix string) {
	t.Helper()
	src := strings.Replace(librarySource, "\nlocal RO = { 'no-writes' }", extra+"\nlocal RO = { 'no-writes' }", 1)
	if src == librarySource {
		t.Fatal("no anchor for the test functions")
	}
	lib := &library{name: name, prefix: prefix}
	lib.code = strings.NewReplacer("__LIBRARY__", lib.name, "__FN__", lib.prefix).Replace(src)
	if err := lib.load(bg, s.client); err != nil {
		t.Fatal(err)
	}
	s.lib = lib
}

// In both record versions (a namespace in format 3 stores version 2).
func TestLibraryMemoAgreesWithDecode(t *testing.T) {
	for _, records := range []bool{false, true} {
		t.Run(map[bool]string{false: "version1", true: "compact_records"}[records], func(t *testing.T) {
			libraryMemoAgreesWithDecode(t, records)
		})
	}
}

func libraryMemoAgreesWithDecode(t *testing.T, records bool) {
	s := open(t, sharedServer(t), Options{StoreOptions: leasetest.StoreOptions(), CompactRecords: records})
	withTestFunctions(t, s, memoCheck, "starlease_memo_check", "slmc_")
	check := func(rec *lease.Record, want string) {
		t.Helper()
		got, err := s.client.Do(bg, s.build(call{fn: "memo_check", ro: true, keys: []string{s.keys.active(tagOf(rec.LockKey))}})).ToString()
		if err != nil || got != want {
			t.Fatalf("memo check: %q %v, want %q", got, err, want)
		}
	}
	for _, meta := range []lease.Metadata{nil, {"purpose": `quote " backslash \ <tag> & ünïcödé`, "n": 1.5, "ok": true, "nothing": nil},
		{"big": 1e21, "small": -0.000001, "tab": "a\tb", "nl": "x\ny", "ctl": "\u0001"}} {
		id := newIdentity()
		req := acquireReq(id)
		req.Metadata = meta
		req.TraceID = ""
		a, err := s.Acquire(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		check(a.Lease, "same")
		if raw, _ := get(t, s, s.keys.active(tagOf(a.Lease.LockKey))); strings.HasPrefix(raw, lease.RecordV2Prefix) != records {
			t.Fatalf("stored record %.20q, want version 2: %v", raw, records)
		}
		r, err := s.Renew(bg, renewReq(a.Lease))
		if err != nil {
			t.Fatal(err)
		}
		check(r.Lease, "same")
		rr := renewReq(r.Lease)
		rr.TTL = 2 * time.Second
		r, err = s.Renew(bg, rr)
		if err != nil {
			t.Fatal(err)
		}
		check(r.Lease, "same")
		if _, err := s.Inspect(bg, lease.InspectRequest{Identity: id, DeadlineAt: far()}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(bg, releaseReq(r.Lease)); err != nil {
			t.Fatal(err)
		}
		check(r.Lease, "no record")
	}
}
