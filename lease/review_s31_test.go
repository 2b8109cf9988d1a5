package lease

// Review of ecfd0b4: the compact writers check version 2 with a matcher
// recordWriter (compare each write with the version 1 bytes) instead of
// building the expansion and comparing strings, and version 2 lines are
// split with splitLines instead of strings.SplitN.
//
// The pre-commit code is copied below under s31o* names, with its own
// writer type, so it shares nothing with the matcher under review. The
// tests compare new and old Compact* (byte for byte) and Expand* (string
// and ok) over generated records, their mutations and hostile raw values;
// test the matcher and splitLines on their own; and check round trips.

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------
// The implementation before ecfd0b4 (lease/evidence_v2.go at ecfd0b4^),
// renamed. Helpers the commit did not touch (plainText, digits, msText,
// msOf, lockKeyTag, recordLinesOK, appendStringField) are shared.

type s31oWriter struct{ strings.Builder }

func s31oNewWriter(extra int) *s31oWriter {
	b := &s31oWriter{}
	b.Grow(1024 + extra)
	return b
}

func (b *s31oWriter) add(parts ...string) {
	for _, s := range parts {
		b.WriteString(s)
	}
}

func (b *s31oWriter) orVersion1(v1 []byte, expand func(string) (string, bool)) []byte {
	if back, ok := expand(b.String()); !ok || back != string(v1) {
		return v1
	}
	return []byte(b.String())
}

func (b *s31oWriter) facts(r *Record) bool {
	meta := []byte("{}")
	if len(r.Metadata) > 0 {
		var err error
		if meta, err = r.Metadata.MarshalJSON(); err != nil {
			return false
		}
	}
	b.add(r.LeaseID, "\n", r.OwnerPrincipalID, "\n", r.OwnerClientID, "\n", r.OwnerCredentialID,
		"\n", r.ServiceInstanceID, "\n", strconv.FormatUint(r.FencingToken, 10),
		"\n", msOf(r.AcquiredAt), "\n", msOf(r.RenewedAt), "\n", msOf(r.ExpiresAt),
		"\n", strconv.FormatInt(r.TTLMs, 10), "\n", strconv.FormatInt(r.MaximumLifetimeMs, 10),
		"\n", r.ExecutionID, "\n", r.JobID, "\n", r.TraceID, "\n", r.RequestID, "\n", string(r.State),
		"\n", string(meta))
	return true
}

func (b *s31oWriter) identified(r *Record) bool {
	b.add(lockKeyTag(r), "\n", r.TenantID, "\n", r.ProgramID, "\n", r.TargetNamespace, "\n", r.TargetID, "\n", r.ActorName,
		"\n", r.WorkflowName, "\n", r.OperationClass, "\n")
	return b.facts(r)
}

func (b *s31oWriter) record(tag string, tuple [7]string, f []string) {
	b.add(`{"record_version":1,"lock_key":"`, KeyPrefix, tag,
		`","tenant_id":"`, tuple[0], `","program_id":"`, tuple[1], `","target_namespace":"`, tuple[2],
		`","target_id":"`, tuple[3], `","actor_name":"`, tuple[4], `","workflow_name":"`, tuple[5],
		`","operation_class":"`, tuple[6], `","lease_id":"`, f[0],
		`","owner_principal_id":"`, f[1], `","owner_client_id":"`, f[2],
		`","owner_credential_id":"`, f[3], `","service_instance_id":"`, f[4],
		`","fencing_token":`, f[5], `,"acquired_at":"`, msText(f[6]), `","renewed_at":"`, msText(f[7]),
		`","expires_at":"`, msText(f[8]), `","ttl_ms":`, f[9], `,"maximum_lifetime_ms":`, f[10],
		`,"execution_id":"`, f[11], `","job_id":"`, f[12], `","trace_id":"`, f[13],
		`","request_id":"`, f[14], `","metadata":`, f[16], `,"state":"`, f[15], `"}`)
}

func s31oExpandEvidence(raw string, id Identity) (string, bool) {
	if !strings.HasPrefix(raw, EvidenceV2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", Ev2Lines)
	if len(f) != Ev2Lines {
		return "", false
	}
	for i := Ev2Op; i < Ev2Metadata; i++ {
		if !plainText(f[i]) {
			return "", false
		}
	}
	for _, i := range []int{Ev2Backend, Ev2Token, Ev2Acquired, Ev2Renewed, Ev2Expires, Ev2TTL, Ev2Lifetime} {
		if !digits(f[i]) {
			return "", false
		}
	}
	meta := f[Ev2Metadata]
	if !strings.HasPrefix(meta, "{") || !json.Valid([]byte(meta)) {
		return "", false
	}
	for _, v := range []string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass} {
		if !plainText(v) {
			return "", false
		}
	}
	b := s31oNewWriter(len(meta))
	b.add(`{"idempotency_version":1,"op":"`, f[Ev2Op], `","digest":"`, f[Ev2Digest], `","code":"`, f[Ev2Code], `","lease":`)
	b.record(f[Ev2Tag], [7]string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName,
		id.OperationClass}, f[Ev2LeaseID:])
	b.add(`,"backend_time":"`, msText(f[Ev2Backend]), `"}`)
	return b.String(), true
}

func s31oCompactEvidence(e *IdempotencyRecord, id Identity) ([]byte, error) {
	v1, err := e.Encode()
	if err != nil {
		return nil, err
	}
	b := s31oNewWriter(metadataRoom)
	b.add(EvidenceV2Prefix, string(e.Op), "\n", e.Digest, "\n", string(e.Code), "\n", msOf(e.BackendTime), "\n",
		lockKeyTag(e.Lease), "\n")
	if !b.facts(e.Lease) {
		return v1, nil
	}
	return b.orVersion1(v1, func(v2 string) (string, bool) { return s31oExpandEvidence(v2, id) }), nil
}

func s31oExpandHistory(raw string) (string, bool) {
	if !strings.HasPrefix(raw, HistoryV2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", Hv2Lines)
	if len(f) != Hv2Lines {
		return "", false
	}
	for _, i := range []int{Hv2Ended, Hv2By, Hv2Request, Hv2Incident} {
		if !plainText(f[i]) {
			return "", false
		}
	}
	if !digits(f[Hv2Ended]) || !recordLinesOK(f[Hv2Tag:]) {
		return "", false
	}
	reason := f[Hv2Reason]
	if reason != "" && (!strings.HasPrefix(reason, `"`) || !json.Valid([]byte(reason))) {
		return "", false
	}
	b := s31oNewWriter(len(f[Hv2Lines-1]) + len(reason))
	b.add(`{"history_version":1,"record":`)
	b.record(f[Hv2Tag], [7]string(f[Hv2Tuple:Hv2Tuple+7]), f[Hv2Record:])
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

func s31oCompactHistory(h *HistoryEntry) ([]byte, error) {
	v1, err := h.Encode()
	if err != nil {
		return nil, err
	}
	r := h.Record
	var reason []byte
	if h.Reason != "" {
		reason = appendStringField(nil, "", h.Reason)
	}
	b := s31oNewWriter(metadataRoom)
	b.add(HistoryV2Prefix, msOf(h.EndedAt), "\n", h.EndedBy, "\n", h.RequestID, "\n", string(reason), "\n", h.IncidentID, "\n")
	if !b.identified(r) {
		return v1, nil
	}
	return b.orVersion1(v1, s31oExpandHistory), nil
}

func s31oExpandRecord(raw string) (string, bool) {
	if !strings.HasPrefix(raw, RecordV2Prefix) {
		return raw, true
	}
	f := strings.SplitN(raw, "\n", Rv2Lines)
	if len(f) != Rv2Lines || !recordLinesOK(f[Rv2Tag:]) {
		return "", false
	}
	b := s31oNewWriter(len(f[Rv2Lines-1]))
	b.record(f[Rv2Tag], [7]string(f[Rv2Tuple:Rv2Tuple+7]), f[Rv2Record:])
	return b.String(), true
}

func s31oCompactRecord(r *Record) ([]byte, error) {
	v1, err := r.Encode()
	if err != nil {
		return nil, err
	}
	b := s31oNewWriter(metadataRoom)
	b.add(RecordV2Prefix)
	if !b.identified(r) {
		return v1, nil
	}
	return b.orVersion1(v1, s31oExpandRecord), nil
}

// ---------------------------------------------------------------------
// Comparison helpers.

// s31Identities are the identities evidence is expanded for: the contract
// one, one differing in a component, a non-ASCII one, and ones that are
// not plain text (ExpandEvidence must refuse those) or empty.
func s31Identities() []Identity {
	own := contractIdentity()
	other := own
	other.TargetID = "target_other"
	uni := own
	uni.TargetID = "ziel-é-1"
	quote := own
	quote.ActorName = `a"b`
	nl := own
	nl.WorkflowName = "a\nb"
	bs := own
	bs.OperationClass = `x\`
	del := own
	del.TenantID = "t\x7f"
	return []Identity{own, other, uni, quote, nl, bs, del, {}}
}

// s31SameExpand fails unless new and old Expand* agree on raw (for
// evidence, under every identity in ids); it returns how many of the
// expansions were ok.
func s31SameExpand(t testing.TB, raw string, ids []Identity) int {
	t.Helper()
	n := 0
	if s31Agree(t, "ExpandRecord", raw, ExpandRecord, s31oExpandRecord) && strings.HasPrefix(raw, RecordV2Prefix) {
		n++
	}
	if s31Agree(t, "ExpandHistory", raw, ExpandHistory, s31oExpandHistory) && strings.HasPrefix(raw, HistoryV2Prefix) {
		n++
	}
	for _, id := range ids {
		if s31AgreeEvidence(t, raw, id) && strings.HasPrefix(raw, EvidenceV2Prefix) {
			n++
		}
	}
	return n
}

// s31Agree fails unless now and before (the new and old expansion of one
// form) give the same result for raw; it returns whether it was ok.
func s31Agree(t testing.TB, name, raw string, now, before func(string) (string, bool)) bool {
	t.Helper()
	gs, gok := now(raw)
	ws, wok := before(raw)
	if gs != ws || gok != wok {
		t.Fatalf("%s(%q): now %q %v, before %q %v", name, raw, gs, gok, ws, wok)
	}
	return gok
}

// s31AgreeEvidence is s31Agree for evidence read for id.
func s31AgreeEvidence(t testing.TB, raw string, id Identity) bool {
	t.Helper()
	gs, gok := ExpandEvidence(raw, id)
	ws, wok := s31oExpandEvidence(raw, id)
	if gs != ws || gok != wok {
		t.Fatalf("ExpandEvidence(%q, %+v): now %q %v, before %q %v", raw, id, gs, gok, ws, wok)
	}
	return gok
}

// s31SameCompact fails unless the new and old compact writer give the same
// bytes and the same error (by code: the text of a metadata error depends
// on map order); it returns the new result.
func s31SameCompact(t testing.TB, what string, now func() ([]byte, error), before func() ([]byte, error)) ([]byte, error) {
	t.Helper()
	gb, gerr := now()
	wb, werr := before()
	if !bytes.Equal(gb, wb) || (gerr == nil) != (werr == nil) || CodeOf(gerr) != CodeOf(werr) {
		t.Fatalf("%s: now %q %v, before %q %v", what, gb, gerr, wb, werr)
	}
	return gb, gerr
}

// ---------------------------------------------------------------------
// Generators.

// s31Digest is a 64-byte digest: hex mostly, sometimes with bytes
// version 2 cannot carry or version 1 escapes (quote, backslash, newline,
// HTML, U+2028, invalid UTF-8), which Encode refuses.
func s31Digest(r *rand.Rand) string {
	if r.Intn(4) != 0 {
		return digest64
	}
	bad := []string{`"`, `\`, "\n", "<", "&", ">", "\u2028", "\xff", "é", "\x00", "\x7f", "\r", " "}[r.Intn(13)]
	d := []byte(digest64[:64-len(bad)])
	at := r.Intn(len(d) + 1)
	return string(d[:at]) + bad + string(d[at:])
}

// s31Evidence returns random evidence (valid or not) and the identity it
// is compacted for: mostly its own, sometimes another or a hostile one.
func s31Evidence(r *rand.Rand) (*IdempotencyRecord, Identity) {
	e := validIdem()
	e.Lease = rvRecord(r)
	e.Op = []Op{OpAcquire, OpRenew, OpRelease, OpForceRelease, OpRevoke, "bogus"}[r.Intn(6)]
	// Mostly the operation's own success (the only code its evidence
	// holds since review 44), sometimes another operation's or a failure.
	e.Code = e.Op.SuccessCode()
	if r.Intn(4) == 0 || e.Code == "" {
		e.Code = []Code{CodeAcquired, CodeRenewed, CodeReleased, CodeForceReleased, CodeRevoked, CodeConflict}[r.Intn(6)]
	}
	e.Digest = s31Digest(r)
	e.BackendTime = UnixMilli([]int64{0, msAcquired, rvMaxMs, r.Int63n(rvMaxMs)}[r.Intn(4)])
	id := e.Lease.Identity()
	if r.Intn(5) == 0 {
		ids := s31Identities()
		id = ids[r.Intn(len(ids))]
	}
	return e, id
}

// s31History returns a random history entry over rvRecord's wider grid.
func s31History(r *rand.Rand) *HistoryEntry {
	h := rhEntry(r)
	if r.Intn(2) == 0 {
		rec := rvRecord(r)
		rec.State = h.Record.State
		h.Record = rec
	}
	return h
}

// s31Hostile are hand-made raw values: empty, prefixes alone, wrong line
// counts, CRLF, non-digit and out-of-range numbers, metadata that is not
// one object, trailing data, v1 without a prefix.
func s31Hostile(t testing.TB) []string {
	t.Helper()
	rec, err := CompactRecord(validRecord())
	if err != nil || !strings.HasPrefix(string(rec), RecordV2Prefix) {
		t.Fatalf("seed record: %q %v", rec, err)
	}
	hist, err := CompactHistory(validHistory())
	if err != nil || !strings.HasPrefix(string(hist), HistoryV2Prefix) {
		t.Fatalf("seed history: %q %v", hist, err)
	}
	e := validIdem()
	ev, err := CompactEvidence(e, e.Lease.Identity())
	if err != nil || !strings.HasPrefix(string(ev), EvidenceV2Prefix) {
		t.Fatalf("seed evidence: %q %v", ev, err)
	}
	v1, _ := validRecord().Encode()
	out := []string{"", "\n", "rv2", "hv2", "ev2", "rv2\n", "hv2\n", "ev2\n", "rv2\r\n", "RV2\n", " rv2\n",
		"rv2\n" + strings.Repeat("\n", Rv2Lines-2), "rv2\n" + strings.Repeat("\n", Rv2Lines-1), "rv2\n" + strings.Repeat("\n", Rv2Lines),
		"hv2\n" + strings.Repeat("\n", Hv2Lines-2), "hv2\n" + strings.Repeat("\n", Hv2Lines-1),
		"ev2\n" + strings.Repeat("\n", Ev2Lines-2), "ev2\n" + strings.Repeat("\n", Ev2Lines-1),
		string(v1), "rv2\n" + string(v1), "hv2\n" + string(v1), "ev2\n" + string(v1), "{}", "null"}
	for _, seed := range []string{string(rec), string(hist), string(ev)} {
		lines := strings.Split(seed, "\n")
		n := len(lines)
		join := func(f []string) string { return strings.Join(f, "\n") }
		edit := func(i int, v string) string {
			f := append([]string(nil), lines...)
			f[i] = v
			return join(f)
		}
		out = append(out, seed, seed+"\n", seed+"\n{}", seed+" ", seed+"x", seed[:len(seed)-1], "\n"+seed,
			strings.ReplaceAll(seed, "\n", "\r\n"), join(lines[:n-1]), join(append(lines[:n-1:n-1], "{}", lines[n-1])),
			seed[:4], seed[:3], seed+seed)
		for i := 1; i < n; i++ {
			for _, v := range []string{"", "0", "00", "01", "-1", "+1", " 1", "1 ", "1e3", "0x1", "１",
				"9999999999999999", "99999999999999999", "9223372036854775807", "18446744073709551616",
				"9007199254740993", `"`, `\`, "\x00", "\x1f", "\x7f", "\t", "é", "\u2028", "\xff", "<&>",
				`{}`, `{ }`, `{"a":1}`, `{"a":1} `, `{"a":1}{}`, `{"a":1},`, `[]`, `null`, `"x"`, `{"a":"\u0000"}`,
				`{"a":}`, `{`, `}`, lines[i] + lines[i], lines[i] + "\r"} {
				out = append(out, edit(i, v))
			}
		}
	}
	return out
}

// s31Corpus returns raw stored values of every shape: real encodings of
// generated records, entries and evidence (v1 and v2), their mutations,
// random line structures around each form's line count, and s31Hostile.
func s31Corpus(t testing.TB, r *rand.Rand, n int) []string {
	t.Helper()
	corpus := s31Hostile(t)
	var seeds [][]byte
	for i := 0; i < n; i++ {
		if b, err := CompactRecord(rvRecord(r)); err == nil {
			corpus = append(corpus, string(b))
			if i%200 == 0 && bytes.HasPrefix(b, []byte(RecordV2Prefix)) {
				seeds = append(seeds, b)
			}
		}
		if b, err := CompactHistory(s31History(r)); err == nil {
			corpus = append(corpus, string(b))
			if i%200 == 0 && bytes.HasPrefix(b, []byte(HistoryV2Prefix)) {
				seeds = append(seeds, b)
			}
		}
		e, id := s31Evidence(r)
		if b, err := CompactEvidence(e, id); err == nil {
			corpus = append(corpus, string(b))
			if i%200 == 0 && bytes.HasPrefix(b, []byte(EvidenceV2Prefix)) {
				seeds = append(seeds, b)
			}
		}
	}
	for _, s := range seeds {
		for _, m := range rhMutations(s, r)[:3000] {
			corpus = append(corpus, string(m))
		}
	}
	for i := 0; i < n; i++ {
		prefix := []string{"rv2", "hv2", "ev2"}[i%3]
		lines := []int{Rv2Lines, Hv2Lines, Ev2Lines}[i%3]
		k := lines - 2 + r.Intn(5)
		f := make([]string, k)
		f[0] = prefix
		for j := 1; j < k; j++ {
			f[j] = rvLine(r)
		}
		corpus = append(corpus, strings.Join(f, "\n"))
	}
	return corpus
}

// ---------------------------------------------------------------------
// Tests.

// Every Expand* answers exactly as before the commit, ok and text, over
// real encodings, their mutations, random line structures and hand-made
// hostile values; evidence under identities own, foreign and not plain.
func TestReviewS31ExpandUnchanged(t *testing.T) {
	r := rand.New(rand.NewSource(31))
	ids := s31Identities()
	corpus := s31Corpus(t, r, 3000)
	expanded := 0
	for _, raw := range corpus {
		expanded += s31SameExpand(t, raw, ids)
	}
	t.Logf("%d raw values, each through 3 expanders (evidence under %d identities); %d version 2 expansions ok",
		len(corpus), len(ids), expanded)
	if expanded < 1000 {
		t.Fatalf("only %d version 2 values expanded: the corpus hardly reaches the writer", expanded)
	}
}

// Every Compact* stores exactly what it stored before the commit (version
// 2 or the version 1 fallback, or the same error), and what it stores
// reads back as the value written.
func TestReviewS31CompactUnchangedAndRoundTrips(t *testing.T) {
	r := rand.New(rand.NewSource(3131))
	type tally struct{ v2, v1, refused int }
	var rec, hist, ev tally
	undecodable := 0
	count := func(c *tally, b []byte, err error, prefix string) {
		switch {
		case err != nil:
			c.refused++
		case bytes.HasPrefix(b, []byte(prefix)):
			c.v2++
		default:
			c.v1++
		}
	}
	for i := 0; i < 20000; i++ {
		// Records.
		rr := rvRecord(r)
		b, err := s31SameCompact(t, "CompactRecord", func() ([]byte, error) { return CompactRecord(rr) },
			func() ([]byte, error) { return s31oCompactRecord(rr) })
		count(&rec, b, err, RecordV2Prefix)
		if err == nil {
			v1, _ := rr.Encode()
			got, derr := DecodeStoredRecord(b)
			want, werr := DecodeRecord(v1)
			if derr != nil || werr != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("record %q reads %+v %v, version 1 reads %+v %v", b, got, derr, want, werr)
			}
			if !bytes.HasPrefix(b, []byte(RecordV2Prefix)) && !bytes.Equal(b, v1) {
				t.Fatalf("record fallback is not version 1: %q", b)
			}
		}

		// History entries.
		h := s31History(r)
		b, err = s31SameCompact(t, "CompactHistory", func() ([]byte, error) { return CompactHistory(h) },
			func() ([]byte, error) { return s31oCompactHistory(h) })
		count(&hist, b, err, HistoryV2Prefix)
		if err == nil {
			v1, _ := h.Encode()
			got, derr := DecodeStoredHistory(b)
			want, werr := DecodeHistoryEntry(v1)
			if derr != nil || werr != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("history %q reads %+v %v, version 1 reads %+v %v", b, got, derr, want, werr)
			}
			if !bytes.HasPrefix(b, []byte(HistoryV2Prefix)) && !bytes.Equal(b, v1) {
				t.Fatalf("history fallback is not version 1: %q", b)
			}
		}

		// Evidence, for its own identity or another.
		e, id := s31Evidence(r)
		b, err = s31SameCompact(t, "CompactEvidence", func() ([]byte, error) { return CompactEvidence(e, id) },
			func() ([]byte, error) { return s31oCompactEvidence(e, id) })
		count(&ev, b, err, EvidenceV2Prefix)
		if err == nil {
			v1, _ := e.Encode()
			back, ok := ExpandEvidence(string(b), id)
			if !ok || back != string(v1) {
				t.Fatalf("evidence %q for %+v expands to %q %v, want %q", b, id, back, ok, v1)
			}
			// Both read alike, and what encodes decodes: Encode takes
			// only 64 lower-case hex digits as the digest (a digest of
			// invalid UTF-8 once encoded as \ufffd and read back corrupt).
			got, derr := DecodeIdempotencyRecord([]byte(back))
			want, werr := DecodeIdempotencyRecord(v1)
			if (derr == nil) != (werr == nil) || CodeOf(derr) != CodeOf(werr) || !reflect.DeepEqual(got, want) {
				t.Fatalf("evidence %q reads %+v %v, version 1 reads %+v %v", b, got, derr, want, werr)
			}
			if derr != nil {
				undecodable++
			}
			if bytes.HasPrefix(b, []byte(EvidenceV2Prefix)) && id != e.Lease.Identity() {
				t.Fatalf("version 2 stored for a foreign identity %+v: %q", id, b)
			}
		}
	}
	t.Logf("record %+v, history %+v, evidence %+v (%d encoded but undecodable)", rec, hist, ev, undecodable)
	// Evidence must exercise both outcomes of the matcher; records and
	// entries that Encode takes always fit version 2 today.
	if rec.v2 == 0 || hist.v2 == 0 || ev.v2 == 0 || ev.v1 < 500 || rec.refused == 0 || hist.refused == 0 || ev.refused == 0 {
		t.Fatal("the grid does not cover the outcomes")
	}
	if undecodable > 0 {
		t.Fatalf("%d evidence values encoded that do not decode", undecodable)
	}
}

// orVersion1 through the matcher against the old string comparison, for
// real version 2 values of all three forms and version 1 candidates that
// are the expansion, empty, a strict prefix of it, longer than it, or it
// with one byte changed (first, second, middle, last two, random).
func TestReviewS31OrVersion1NearMisses(t *testing.T) {
	r := rand.New(rand.NewSource(313))
	type form struct {
		v2  string
		now func(*recordWriter, string) bool
		old func(string) (string, bool)
	}
	var forms []form
	id := contractIdentity()
	for len(forms) < 60 {
		rec := rvRecord(r)
		if _, err := rec.Encode(); err != nil {
			continue
		}
		b := newRecordWriter(metadataRoom)
		b.add(RecordV2Prefix)
		b.identified(rec)
		forms = append(forms, form{b.String(), expandRecord, s31oExpandRecord})
		h := validHistory()
		h.Record.Metadata = rec.Metadata
		b = newRecordWriter(metadataRoom)
		b.add(HistoryV2Prefix, msOf(h.EndedAt), "\n", h.EndedBy, "\n", h.RequestID, "\n", `"r"`, "\n", h.IncidentID, "\n")
		b.identified(h.Record)
		forms = append(forms, form{b.String(), expandHistory, s31oExpandHistory})
		e := validIdem()
		e.Lease.Metadata = rec.Metadata
		b = newRecordWriter(metadataRoom)
		b.add(EvidenceV2Prefix, string(e.Op), "\n", e.Digest, "\n", string(e.Code), "\n", msOf(e.BackendTime), "\n",
			lockKeyTag(e.Lease), "\n")
		b.facts(e.Lease)
		forms = append(forms, form{b.String(), func(m *recordWriter, v2 string) bool { return expandEvidence(m, v2, id) },
			func(v2 string) (string, bool) { return s31oExpandEvidence(v2, id) }})
	}
	checked := 0
	for _, f := range forms {
		full, ok := f.old(f.v2)
		if !ok {
			t.Fatalf("%q does not expand", f.v2)
		}
		cands := [][]byte{[]byte(full), nil, {}, []byte(full[:len(full)-1]), []byte(full + "}"), []byte(full + full),
			[]byte(full[:1]), []byte(" " + full), []byte(full[1:])}
		for _, at := range []int{0, 1, len(full) / 2, len(full) - 2, len(full) - 1, r.Intn(len(full))} {
			c := []byte(full)
			c[at] ^= 1
			cands = append(cands, c)
		}
		for _, v1 := range cands {
			nb := newRecordWriter(0)
			nb.add(f.v2)
			ob := &s31oWriter{}
			ob.add(f.v2)
			got, want := nb.orVersion1(v1, f.now), ob.orVersion1(v1, f.old)
			if !bytes.Equal(got, want) {
				t.Fatalf("v1 %q: orVersion1 = %q, before %q", v1, got, want)
			}
			if string(v1) == full && string(got) != f.v2 || string(v1) != full && !bytes.Equal(got, v1) {
				t.Fatalf("v1 %q: orVersion1 = %q", v1, got)
			}
			checked++
		}
	}
	t.Logf("%d version 2 values, %d candidates", len(forms), checked)
}

// The matcher on its own: for a document and write sequences that spell
// it, a prefix of it, more than it, or it with one byte changed (before,
// at or after a write boundary), matched() holds exactly when the writes
// concatenate to the document; a mismatch is final even if later writes
// would line up again; the matcher builds nothing.
func TestReviewS31Matcher(t *testing.T) {
	type tc struct {
		want  string
		parts [][]string // one add call per element
		ok    bool
	}
	cases := []tc{
		{"", nil, true},
		{"", [][]string{{""}}, true},
		{"", [][]string{{"", ""}, {}}, true},
		{"", [][]string{{"x"}}, false},
		{"abc", nil, false},
		{"abc", [][]string{{"abc"}}, true},
		{"abc", [][]string{{"a", "b", "c"}}, true},
		{"abc", [][]string{{"a"}, {""}, {"bc"}}, true},
		{"abc", [][]string{{"ab"}}, false},                 // strict prefix
		{"abc", [][]string{{"abcd"}}, false},               // longer in one write
		{"abc", [][]string{{"abc"}, {"d"}}, false},         // longer by a later write
		{"abc", [][]string{{"abc", ""}, {"", "d"}}, false}, // longer after empty writes
		{"abc", [][]string{{"abd"}}, false},                // last byte differs
		{"abc", [][]string{{"ab", "d"}}, false},
		{"abc", [][]string{{"xbc"}}, false},              // first byte differs
		{"abc", [][]string{{"a", "z", "c"}}, false},      // mismatch, later parts line up
		{"abc", [][]string{{"a"}, {"z"}, {"bc"}}, false}, // mismatch, later call spells the rest
		{"abc", [][]string{{"a", "z"}, {"c"}}, false},    // off not advanced past z: c must not rescue it
		{"ab", [][]string{{"a", "x"}, {"b"}}, false},     // ...nor b here
		{"abc", [][]string{{"abcabc"}}, false},
		{"a\x00c", [][]string{{"a\x00c"}}, true},
		{"a\x00c", [][]string{{"a", "\x00"}}, false},
		{"é", [][]string{{"\xc3"}, {"\xa9"}}, true}, // split inside a rune
		{"é", [][]string{{"\xc3"}}, false},
	}
	for _, c := range cases {
		for _, wantNil := range []bool{false, true} {
			var w []byte
			if !wantNil || c.want != "" {
				w = []byte(c.want)
			}
			m := matcher(w)
			for _, p := range c.parts {
				m.add(p...)
			}
			if m.matched() != c.ok {
				t.Fatalf("want %q, writes %q: matched() = %v", c.want, c.parts, !c.ok)
			}
			if m.Len() != 0 {
				t.Fatalf("a matcher built %q", m.String())
			}
		}
	}
	// A building writer is never "matched" and builds the concatenation.
	b := newRecordWriter(0)
	b.add("a", "b")
	b.add("c")
	if b.matched() || b.String() != "abc" {
		t.Fatalf("building writer: matched %v, %q", b.matched(), b.String())
	}
	// Random documents over a small alphabet (so near misses are common)
	// and random write splits of random near-miss texts.
	r := rand.New(rand.NewSource(3))
	hits := 0
	for i := 0; i < 200000; i++ {
		doc := s31Small(r, 12)
		text := doc
		switch r.Intn(6) {
		case 0:
			text = s31Small(r, 12)
		case 1:
			if len(text) > 0 {
				text = text[:r.Intn(len(text))]
			}
		case 2:
			text += s31Small(r, 3)
		case 3:
			if len(text) > 0 {
				k := r.Intn(len(text))
				text = text[:k] + string("ab\x00"[r.Intn(3)]) + text[k+1:]
			}
		}
		m := matcher([]byte(doc))
		rest := text
		for len(rest) > 0 || r.Intn(4) == 0 {
			var parts []string
			for n := r.Intn(4); n > 0; n-- {
				k := 0
				if len(rest) > 0 {
					k = r.Intn(len(rest) + 1)
				}
				parts = append(parts, rest[:k])
				rest = rest[k:]
			}
			m.add(parts...)
			if len(rest) == 0 && r.Intn(2) == 0 {
				break
			}
		}
		m.add(rest)
		if m.matched() != (text == doc) {
			t.Fatalf("doc %q, written %q: matched() = %v", doc, text, m.matched())
		}
		if text == doc {
			hits++
		}
	}
	if hits < 10000 {
		t.Fatalf("only %d exact spellings", hits)
	}
}

func s31Small(r *rand.Rand, max int) string {
	b := make([]byte, r.Intn(max+1))
	for i := range b {
		b[i] = "ab\x00"[r.Intn(3)]
	}
	return string(b)
}

// splitLines equals strings.SplitN with len(f) parts (ok exactly when it
// gives len(f) parts) over every string of up to 6 bytes of "\n", "a" and
// "\r", for every f length from 1 to 8, and on real encodings at the
// three forms' line counts.
func TestReviewS31SplitLines(t *testing.T) {
	check := func(s string, n int) {
		f := make([]string, n)
		ok := splitLines(s, f)
		want := strings.SplitN(s, "\n", n)
		if ok != (len(want) == n) || ok && !reflect.DeepEqual(f, want) {
			t.Fatalf("splitLines(%q, %d) = %q %v, SplitN %q", s, n, f, ok, want)
		}
	}
	var gen func(prefix string, depth int)
	gen = func(prefix string, depth int) {
		for n := 1; n <= 8; n++ {
			check(prefix, n)
		}
		if depth == 0 {
			return
		}
		for _, c := range []string{"\n", "a", "\r"} {
			gen(prefix+c, depth-1)
		}
	}
	gen("", 6)
	for _, raw := range s31Hostile(t) {
		for _, n := range []int{Rv2Lines, Hv2Lines, Ev2Lines, Rv2Lines - 1, Ev2Lines + 1} {
			check(raw, n)
		}
	}
}

// ---------------------------------------------------------------------
// Fuzz targets: new Expand* equals old on arbitrary input. The seed corpus
// (real encodings and s31Hostile) runs as part of go test.

func s31FuzzSeeds(f *testing.F) {
	for _, s := range s31Hostile(f) {
		f.Add(s)
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		if b, err := CompactRecord(rvRecord(r)); err == nil {
			f.Add(string(b))
		}
		if b, err := CompactHistory(s31History(r)); err == nil {
			f.Add(string(b))
		}
		if e, id := s31Evidence(r); id == e.Lease.Identity() {
			if b, err := CompactEvidence(e, id); err == nil {
				f.Add(string(b))
			}
		}
	}
}

func FuzzReviewS31ExpandRecord(f *testing.F) {
	s31FuzzSeeds(f)
	f.Fuzz(func(t *testing.T, raw string) { s31Agree(t, "ExpandRecord", raw, ExpandRecord, s31oExpandRecord) })
}

func FuzzReviewS31ExpandHistory(f *testing.F) {
	s31FuzzSeeds(f)
	f.Fuzz(func(t *testing.T, raw string) { s31Agree(t, "ExpandHistory", raw, ExpandHistory, s31oExpandHistory) })
}

// The evidence target also fuzzes one identity component (which one is
// chosen by the input), since the tuple comes from the request.
func FuzzReviewS31ExpandEvidence(f *testing.F) {
	s31FuzzSeeds(f)
	f.Fuzz(func(t *testing.T, raw string) {
		ids := s31Identities()
		if i := strings.LastIndexByte(raw, '\x01'); i >= 0 {
			id := contractIdentity()
			v := raw[i+1:]
			switch len(v) % 7 {
			case 0:
				id.TenantID = v
			case 3:
				id.TargetID = v
			default:
				id.ActorName = v
			}
			ids = append(ids, id)
		}
		for _, id := range ids {
			s31AgreeEvidence(t, raw, id)
		}
	})
}

// The matcher against plain comparison on arbitrary documents and writes
// (writes split at the bytes of cuts).
func FuzzReviewS31Matcher(f *testing.F) {
	f.Add("abc", "abc", []byte{1, 1})
	f.Add("abc", "ab", []byte{})
	f.Add("", "", []byte{0})
	f.Add("abc", "abcd", []byte{3})
	f.Fuzz(func(t *testing.T, doc, text string, cuts []byte) {
		m := matcher([]byte(doc))
		rest := text
		for _, c := range cuts {
			k := int(c)
			if k > len(rest) {
				k = len(rest)
			}
			m.add(rest[:k])
			rest = rest[k:]
		}
		m.add(rest)
		if m.matched() != (doc == text) {
			t.Fatalf("doc %q, written %q (cuts %v): matched() = %v", doc, text, cuts, m.matched())
		}
	})
}
