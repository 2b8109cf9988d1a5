package lease

// Review rv2 (commits 5ee04d9 5a1028b 5617523): attacks on appendTimestamp,
// RecordMemo, CompactRecord / ExpandRecord / DecodeStoredRecord and the
// ExpandHistory refactor. Each test tries to break one promise.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// ---------------------------------------------------------------------
// appendTimestamp == time.Time.AppendFormat(b, timestampLayout)

func TestReviewRv2AppendTimestampEqualsAppendFormat(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("p", 5*3600+30*60+17), time.FixedZone("m", -(11*3600 + 59*60 + 59)),
		time.FixedZone("big", 23*3600+59*60), time.FixedZone("nbig", -23*3600-59*60), time.FixedZone("z", 0)}
	for _, name := range []string{"America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe", "Pacific/Kiritimati", "Africa/Monrovia", "Europe/Dublin"} {
		if loc, err := time.LoadLocation(name); err == nil {
			zones = append(zones, loc)
		}
	}
	var instants []time.Time
	fixed := []time.Time{{}, time.Unix(0, 0), time.Unix(-1, 999_999_999), time.Unix(0, -1), time.Now(),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(292277026596, 12, 4, 15, 30, 7, 999999999, time.UTC), time.Unix(math.MaxInt64/2, 0), time.Unix(math.MinInt64/2, 0),
		time.Unix(1<<40, 0), time.Unix(-(1 << 40), 0), time.Date(2000, 2, 29, 23, 59, 59, 999_000_000, time.UTC),
		time.Date(1600, 2, 29, 12, 0, 0, 1, time.UTC), time.Date(1900, 3, 1, 0, 0, 0, 0, time.UTC)}
	instants = append(instants, fixed...)
	for _, z := range zones {
		for _, f := range fixed {
			instants = append(instants, f.In(z))
		}
	}
	const span = int64(400_000) * 366 * 86400 // about ±400,000 years
	for i := 0; i < 300_000; i++ {
		var sec int64
		switch r.Intn(4) {
		case 0:
			sec = r.Int63n(2*span) - span
		case 1:
			sec = r.Int63n(253402300800+86400*2) - 86400 // 1970..10000
		case 2:
			sec = r.Int63n(2*62135596800) - 62135596800 - 86400*400 // around years -400..1970
		default:
			sec = r.Int63() - math.MaxInt64/2
		}
		tt := time.Unix(sec, r.Int63n(1e9))
		if r.Intn(3) > 0 {
			tt = tt.In(zones[r.Intn(len(zones))])
		}
		instants = append(instants, tt)
	}
	n := 0
	for _, tt := range instants {
		for _, prefix := range [][]byte{nil, []byte(`x"`)} {
			want := tt.AppendFormat(bytes.Clone(prefix), timestampLayout)
			got := appendTimestamp(bytes.Clone(prefix), tt)
			if !bytes.Equal(got, want) {
				t.Fatalf("%v (%s): appendTimestamp %q, AppendFormat %q", tt, tt.Location(), got, want)
			}
			n++
		}
		if s := (Timestamp{tt}).String(); s != tt.Format(timestampLayout) {
			t.Fatalf("%v: String %q, Format %q", tt, s, tt.Format(timestampLayout))
		}
	}
	t.Logf("%d instants compared (%d zones)", n, len(zones))
}

// ---------------------------------------------------------------------
// ExpandHistory / CompactHistory exactly as before the refactor (ae5aeee).

func expandHistoryOld(raw string) (string, bool) {
	if !strings.HasPrefix(raw, HistoryV2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", Hv2Lines)
	if len(f) != Hv2Lines {
		return "", false
	}
	for i := Hv2Ended; i < Hv2Lines-1; i++ {
		if i != Hv2Reason && !plainText(f[i]) {
			return "", false
		}
	}
	rec := f[Hv2Record:]
	for _, v := range []string{f[Hv2Ended], rec[5], rec[6], rec[7], rec[8], rec[9], rec[10]} {
		if !digits(v) {
			return "", false
		}
	}
	meta, reason := rec[16], f[Hv2Reason]
	if !strings.HasPrefix(meta, "{") || !json.Valid([]byte(meta)) {
		return "", false
	}
	if reason != "" && (!strings.HasPrefix(reason, `"`) || !json.Valid([]byte(reason))) {
		return "", false
	}
	b := newRecordWriter(len(meta) + len(reason))
	b.add(`{"history_version":1,"record":`)
	b.record(f[Hv2Tag], [7]string(f[Hv2Tuple:Hv2Tuple+7]), rec)
	b.add(`,"ended_at":"`, msText(f[Hv2Ended]), `"`)
	if v := f[Hv2By]; v != "" {
		b.add(`,"ended_by":"`, v, `"`)
	}
	if v := f[Hv2Request]; v != "" {
		b.add(`,"request_id":"`, v, `"`)
	}
	if reason != "" {
		b.add(`,"reason":`, reason)
	}
	if v := f[Hv2Incident]; v != "" {
		b.add(`,"incident_id":"`, v, `"`)
	}
	b.add(`}`)
	return b.String(), true
}

func compactHistoryOld(h *HistoryEntry) ([]byte, error) {
	v1, err := h.Encode()
	if err != nil {
		return nil, err
	}
	r := h.Record
	var reason []byte
	if h.Reason != "" {
		reason = appendStringField(nil, "", h.Reason)
	}
	b := newRecordWriter(metadataRoom)
	b.add(HistoryV2Prefix, msOf(h.EndedAt), "\n", h.EndedBy, "\n", h.RequestID, "\n", string(reason), "\n", h.IncidentID,
		"\n", lockKeyTag(r), "\n", r.TenantID, "\n", r.ProgramID, "\n", r.TargetNamespace, "\n", r.TargetID, "\n", r.ActorName,
		"\n", r.WorkflowName, "\n", r.OperationClass, "\n")
	if !b.facts(r) {
		return v1, nil
	}
	if back, ok := expandHistoryOld(b.String()); !ok || back != string(v1) {
		return v1, nil
	}
	return []byte(b.String()), nil
}

// rvLine is a random line of a version 2 form: digits, text, JSON,
// hostile bytes.
func rvLine(r *rand.Rand) string {
	switch r.Intn(8) {
	case 0:
		return fmt.Sprint(r.Int63n(1 << uint(1+r.Intn(60))))
	case 1:
		return ""
	case 2:
		return rhString(r, 4)
	case 3:
		return []string{`{}`, `{"a":1}`, `{ }`, `{"a":"\n"}`, `"x"`, `"a\"b"`, `{"a":1}` + "\n" + `x`, "{\n}", `[]`, `null`}[r.Intn(10)]
	case 4:
		return []string{"active", "released", "0", "01", "-1", "9999999999999999", "99999999999999999"}[r.Intn(7)]
	default:
		return fmt.Sprintf("id_%d", r.Intn(100))
	}
}

func TestReviewRv2ExpandHistoryUnchanged(t *testing.T) {
	r := rand.New(rand.NewSource(99))
	var corpus []string
	for i := 0; i < 20000; i++ {
		h := rhEntry(r)
		nb, nerr := CompactHistory(h)
		ob, oerr := compactHistoryOld(h)
		if (nerr == nil) != (oerr == nil) || !bytes.Equal(nb, ob) {
			t.Fatalf("CompactHistory changed: now %q %v, before %q %v", nb, nerr, ob, oerr)
		}
		if nerr == nil {
			corpus = append(corpus, string(nb))
		}
	}
	for _, seed := range rhSeeds(t) {
		for _, m := range rhMutations(seed, r) {
			corpus = append(corpus, string(m))
		}
	}
	// Random line structures around Hv2Lines lines.
	for i := 0; i < 100000; i++ {
		n := Hv2Lines - 2 + r.Intn(5)
		f := make([]string, n)
		f[0] = "hv2"
		for j := 1; j < n; j++ {
			f[j] = rvLine(r)
		}
		// Often mostly valid: digits where digits go, JSON last.
		if r.Intn(2) == 0 && n >= Hv2Lines {
			f[Hv2Ended] = fmt.Sprint(r.Int63n(1 << 50))
			for k := 5; k <= 10; k++ {
				f[Hv2Record+k] = fmt.Sprint(1 + r.Int63n(1<<40))
			}
			f[n-1] = []string{`{}`, `{"a":1}`, `{"a":"x"} `, "{}\n{}", `{"a":1}` + "\n"}[r.Intn(5)]
		}
		corpus = append(corpus, strings.Join(f, "\n"))
	}
	diff, ok := 0, 0
	for _, raw := range corpus {
		ws, wok := expandHistoryOld(raw)
		gs, gok := ExpandHistory(raw)
		if ws != gs || wok != gok {
			t.Fatalf("%q: before %q %v, now %q %v", raw, ws, wok, gs, gok)
		}
		if gok {
			ok++
		}
		diff++
	}
	t.Logf("%d inputs compared, %d expanded", diff, ok)
}

// ---------------------------------------------------------------------
// CompactRecord / DecodeStoredRecord round trip over a wider grid than
// rhEntry (every timestamp range, bounds, non-ASCII tuples, json.Number
// metadata, every state).

var rvIdentPieces = []string{"a", "z", "0", "9", "-", "_", ".", ":", "é", "ß", "ж", "中", "ǆ", "Ⅸ", "ﬀ", "İ", "Σ", "ς", "e\u0301",
	"\u00a0", " ", "A", "<", "&", "\u2028", "😀", "١", "ℌ", "K"}

func rvIdentifier(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString([]string{"a", "é", "0", "中", "x"}[r.Intn(5)])
	for n := r.Intn(6); n > 0; n-- {
		b.WriteString(rvIdentPieces[r.Intn(len(rvIdentPieces))])
	}
	return b.String()
}

func rvMetadata(r *rand.Rand) Metadata {
	if r.Intn(3) == 0 {
		return rhMetadata(r)
	}
	m := Metadata{}
	for n := r.Intn(5); n > 0; n-- {
		k := []string{"a", "b", "k_1", "é", "x.y", "z:z", "A", "long" + strings.Repeat("x", 60)}[r.Intn(8)]
		switch r.Intn(7) {
		case 0:
			m[k] = json.Number([]string{"1", "1.0", "-0", "1e5", "1E5", "0.000001", "123456789012345678901234567890", "1e300", "-1.5e-7", "0", "01", "+1", "0x1", "1e400"}[r.Intn(14)])
		case 1:
			m[k] = []string{"\u2028", "<a&b>", "é", "\x00", "line\nnext", `q"uote`, `back\slash`, "😀", "rv2\n", "\xff"}[r.Intn(10)]
		case 2:
			m[k] = r.NormFloat64() * math.Pow(10, float64(r.Intn(40)-20))
		case 3:
			if r.Intn(10) == 0 {
				m[k] = []any{1, 2}
			} else {
				m[k] = r.Intn(2) == 0
			}
		case 4, 5:
			m[k] = int64(r.Int63())
		default:
			m[k] = nil
		}
	}
	return m
}

const rvMaxMs = int64(253402300799999) // 9999-12-31T23:59:59.999Z

func rvRecord(r *rand.Rand) *Record {
	// hostile: one field in ten is drawn from a grid of mostly invalid
	// values; otherwise from valid ones (bounds included).
	hostile := func() bool { return r.Intn(10) == 0 }
	rec := validRecord()
	if r.Intn(2) == 0 {
		id := Identity{rvIdentifier(r), rvIdentifier(r), rvIdentifier(r), rvIdentifier(r), rvIdentifier(r), rvIdentifier(r), rvIdentifier(r)}
		if !hostile() {
			if n, err := id.Normalize(OperationClasses{allowed: map[string]bool{foldIdentifier(id.OperationClass): true}}); err == nil {
				id = n
			} else {
				id = contractIdentity()
				id.TargetID = "ziel-é-" + fmt.Sprint(r.Intn(100))
				id.ActorName = []string{"中文", "ж", "ß", "usernamegen"}[r.Intn(4)]
			}
		}
		rec.SetIdentity(id)
		rec.LockKey = id.lockKeyOfCanonical()
		if r.Intn(40) == 0 {
			rec.LockKey = "no-prefix:" + rec.LockKey
		}
	}
	for _, p := range []*string{&rec.LeaseID, &rec.OwnerPrincipalID, &rec.OwnerClientID, &rec.OwnerCredentialID,
		&rec.ServiceInstanceID, &rec.ExecutionID, &rec.JobID, &rec.TraceID, &rec.RequestID} {
		switch {
		case r.Intn(30) == 0:
			*p = rhOpaque(r)
		case r.Intn(3) == 0:
			*p = []string{"a", "Z9", "a.b_c-d:e", strings.Repeat("x", 256), "lease_" + fmt.Sprint(r.Int63())}[r.Intn(5)]
		}
	}
	if r.Intn(3) == 0 {
		rec.TraceID = ""
	}
	switch r.Intn(5) {
	case 0:
		rec.FencingToken = 1
	case 1:
		rec.FencingToken = MaxFencingToken - uint64(r.Intn(2))
	case 2:
		if hostile() {
			rec.FencingToken = uint64(r.Int63n(1 << 62))
		}
	default:
		rec.FencingToken = 1 + uint64(r.Int63n(int64(MaxFencingToken)))
	}
	ttl := []int64{1, 2, MaxTTL.Milliseconds(), 1 + r.Int63n(MaxTTL.Milliseconds())}[r.Intn(4)]
	if hostile() {
		ttl = MaxTTL.Milliseconds() + 1
	}
	life := []int64{ttl, MaxLifetime.Milliseconds(), ttl + r.Int63n(MaxLifetime.Milliseconds()-ttl+1)}[r.Intn(3)]
	if hostile() {
		life = MaxLifetime.Milliseconds() + 1
	}
	var acq int64
	switch r.Intn(5) {
	case 0:
		acq = 0
	case 1:
		acq = rvMaxMs - life
	case 2:
		acq = r.Int63n(rvMaxMs - life)
	case 3:
		if hostile() {
			acq = -1 - r.Int63n(1000)
		}
	default:
		acq = msAcquired + r.Int63n(1e9)
	}
	ren := acq + r.Int63n(life-ttl+1)
	exp := ren + 1 + r.Int63n(ttl)
	if exp > acq+life {
		exp = acq + life
	}
	if hostile() {
		exp = ren + ttl + 1
	}
	rec.AcquiredAt, rec.RenewedAt, rec.ExpiresAt, rec.TTLMs, rec.MaximumLifetimeMs = UnixMilli(acq), UnixMilli(ren), UnixMilli(exp), ttl, life
	if r.Intn(20) == 0 { // sub-millisecond precision, as a caller might build it
		rec.ExpiresAt = Timestamp{rec.ExpiresAt.t.Add(time.Duration(r.Intn(999_999)))}
	}
	rec.Metadata = rvMetadata(r)
	rec.State = []State{StateActive, StateExpired, StateReleased, StateRevoked}[r.Intn(4)]
	if r.Intn(40) == 0 {
		rec.State = []State{"Active", "", "active\n"}[r.Intn(3)]
	}
	return rec
}

func TestReviewRv2CompactRecordRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(424242))
	var v2, v1only, refused int
	states := map[State]int{}
	nonASCII := 0
	for i := 0; i < 60000; i++ {
		rec := rvRecord(r)
		v1, encErr := rec.Encode()
		b, err := CompactRecord(rec)
		if encErr != nil {
			refused++
			if err == nil {
				t.Fatalf("Encode refuses (%v), CompactRecord took it: %q", encErr, b)
			}
			continue
		}
		if err != nil {
			t.Fatalf("CompactRecord refused what Encode takes: %v", err)
		}
		got, err := DecodeStoredRecord(b)
		if err != nil {
			t.Fatalf("stored %q does not read back: %v", b, err)
		}
		want, werr := DecodeRecord(v1)
		if werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("version 2 read %+v, version 1 read %+v (%v)", got, want, werr)
		}
		if again, _ := got.Encode(); !bytes.Equal(again, v1) {
			t.Fatalf("read back\n%s\nwant\n%s", again, v1)
		}
		if again, _ := CompactRecord(got); !bytes.Equal(again, b) {
			t.Fatalf("re-compacted %q, stored %q", again, b)
		}
		if back, ok := ExpandRecord(string(b)); !ok || back != string(v1) {
			t.Fatalf("ExpandRecord %q %v, want %q", back, ok, v1)
		}
		states[got.State]++
		if !rvASCII(got.TargetID + got.TenantID + got.ActorName) {
			nonASCII++
		}
		if bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
			v2++
		} else {
			v1only++
			if !bytes.Equal(b, v1) {
				t.Fatalf("fallback is not version 1: %q", b)
			}
		}
	}
	t.Logf("%d v2, %d v1 fallbacks, %d refused; states %v; %d non-ASCII tuples", v2, v1only, refused, states, nonASCII)
	if v2 == 0 || len(states) != 4 || nonASCII == 0 {
		t.Fatal("grid does not cover the cases")
	}
}

func rvASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------
// Corruption of rv2: refused as corrupt, or the unique canonical spelling.

func rvSeeds(t *testing.T, r *rand.Rand) [][]byte {
	t.Helper()
	var seeds [][]byte
	for len(seeds) < 12 {
		rec := rvRecord(r)
		if len(seeds) < 4 {
			rec = validRecord()
			rec.State = []State{StateActive, StateExpired, StateReleased, StateRevoked}[len(seeds)]
			rec.Metadata = Metadata{"n": json.Number("1.50"), "s": "é<\u2028", "b": true, "z": nil}
		}
		b, err := CompactRecord(rec)
		if err != nil || !bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
			continue
		}
		seeds = append(seeds, b)
	}
	return seeds
}

func TestReviewRv2CorruptRecordsFailClosedOrCanonical(t *testing.T) {
	r := rand.New(rand.NewSource(31337))
	c := spellings[*Record]{decode: DecodeStoredRecord, compact: CompactRecord}
	check := func(m []byte) { c.check(t, m) }
	seeds := rvSeeds(t, r)
	for si, seed := range seeds {
		for _, m := range rhMutations(seed, r) {
			check(m)
		}
		// Every single byte changed to each of a set of bytes (first seeds).
		if si < 3 {
			for i := 0; i < len(seed); i++ {
				for _, c := range []byte("\n\"\\0129 {}aAz,:.-_\x00\x7f\xc3\xa9\xff") {
					if seed[i] == c {
						continue
					}
					m := bytes.Clone(seed)
					m[i] = c
					check(m)
				}
				check(append(bytes.Clone(seed[:i]), seed[i+1:]...))                        // deleted
				check(append(append(bytes.Clone(seed[:i]), seed[i]), seed[i:]...))         // doubled
				check(append(append(bytes.Clone(seed[:i]), []byte("\n")...), seed[i:]...)) // a line split
			}
		}
		// Every prefix.
		for i := 0; i <= len(seed); i++ {
			check(seed[:i])
		}
	}
	t.Logf("%d accepted (each canonical), %d refused", c.accepted, c.refused)
}

// Lines of another identity's rv2 record spliced in: with only the tag, only
// the tuple, or one tuple line, the record is corrupt; with tag and tuple
// both, it is exactly the other identity's record (which bolt must refuse
// under this key: see bolt TestReviewRv2SplicedRecordCorrupt).
func TestReviewRv2SplicedIdentity(t *testing.T) {
	a := validRecord()
	bID := contractIdentity()
	bID.TargetID = "ziel-é-2"
	b := validRecord()
	b.SetIdentity(bID)
	b.LockKey = bID.lockKeyOfCanonical()
	av, _ := CompactRecord(a)
	bv, _ := CompactRecord(b)
	al, bl := strings.Split(string(av), "\n"), strings.Split(string(bv), "\n")
	if len(al) != Rv2Lines || len(bl) != Rv2Lines {
		t.Fatal("seeds not rv2")
	}
	mix := func(from []int) []byte {
		f := append([]string(nil), al...)
		for _, i := range from {
			f[i] = bl[i]
		}
		return []byte(strings.Join(f, "\n"))
	}
	var tuple []int
	for i := Rv2Tuple; i < Rv2Tuple+7; i++ {
		tuple = append(tuple, i)
		if _, err := DecodeStoredRecord(mix([]int{i})); i == Rv2Tuple+3 && CodeOf(err) != CodeCorrupt {
			t.Fatalf("tuple line %d of another identity: %v, want corrupt", i, err)
		}
	}
	for name, lines := range map[string][]int{"tag": {Rv2Tag}, "tuple": tuple} {
		if _, err := DecodeStoredRecord(mix(lines)); CodeOf(err) != CodeCorrupt {
			t.Fatalf("%s of another identity: %v, want corrupt", name, err)
		}
	}
	got, err := DecodeStoredRecord(mix(append([]int{Rv2Tag}, tuple...)))
	if err != nil || got.LockKey != b.LockKey || got.TargetID != b.TargetID {
		t.Fatalf("whole identity of another: %+v %v", got, err)
	}
}

// ---------------------------------------------------------------------
// RecordMemo: answers exactly as its decoder, never leaks a caller's
// change, safe under concurrency (run with -race), bounded.

func TestReviewRv2MemoConcurrent(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	var raws [][]byte
	for len(raws) < 300 {
		rec := rvRecord(r)
		if v1, err := rec.Encode(); err == nil {
			b, _ := CompactRecord(rec)
			raws = append(raws, v1, b, append(bytes.Clone(b), ' '))
		}
	}
	want := make([]*Record, len(raws))
	werr := make([]error, len(raws))
	for i, raw := range raws {
		want[i], werr[i] = DecodeStoredRecord(raw)
	}
	mm := NewRecordMemo(DecodeStoredRecord)
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			for i := 0; i < 6000; i++ {
				k := r.Intn(len(raws))
				got, err := mm.Decode(raws[k])
				if (err == nil) != (werr[k] == nil) || !reflect.DeepEqual(got, want[k]) {
					select {
					case errs <- fmt.Sprintf("%q: memo %+v %v, decoder %+v %v", raws[k], got, err, want[k], werr[k]):
					default:
					}
					return
				}
				if got != nil { // a caller's changes, of every kind
					got.State = StateRevoked
					got.LeaseID = "changed"
					got.FencingToken++
					if got.Metadata != nil {
						got.Metadata["injected"] = "x"
						for key := range got.Metadata {
							got.Metadata[key] = "overwritten"
						}
					}
					got.ExpiresAt = UnixMilli(0)
				}
				if r.Intn(50) == 0 { // churn: push entries out
					rec := validRecord()
					rec.FencingToken = uint64(1 + r.Intn(1<<40))
					b, _ := CompactRecord(rec)
					if _, err := mm.Decode(b); err != nil {
						panic(err)
					}
				}
			}
		}(int64(g))
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if mm.Len() > RecordMemoMax {
		t.Fatalf("memo holds %d", mm.Len())
	}
	// Beyond the bound with distinct records, every answer is still exact.
	for i := 0; i < 3*RecordMemoMax; i++ {
		rec := validRecord()
		rec.FencingToken = uint64(i + 1)
		b, _ := CompactRecord(rec)
		got, err := mm.Decode(b)
		if err != nil || got.FencingToken != uint64(i+1) {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if mm.Len() > RecordMemoMax {
		t.Fatalf("memo holds %d", mm.Len())
	}
}

// A memo's first answer (the miss) is the caller's; changing it must not
// change what the memo keeps.
func TestReviewRv2MemoMissAnswerIsNotKept(t *testing.T) {
	rec := validRecord()
	rec.Metadata = Metadata{"k": "v"}
	b, _ := CompactRecord(rec)
	want, _ := DecodeStoredRecord(b)
	mm := NewRecordMemo(DecodeStoredRecord)
	first, err := mm.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	first.Metadata["k"] = "changed"
	delete(first.Metadata, "k")
	first.Metadata["new"] = 1
	first.LockKey = "x"
	second, _ := mm.Decode(b)
	third, _ := mm.Decode(b)
	if !reflect.DeepEqual(second, want) || !reflect.DeepEqual(third, want) {
		t.Fatalf("leaked: %+v", second)
	}
	second.Metadata["k"] = "again"
	if third.Metadata["k"] != "v" {
		t.Fatal("two hits share metadata")
	}
}
