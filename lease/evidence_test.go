package lease

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var digest64 = strings.Repeat("ab", 32)

func validIdem() *IdempotencyRecord {
	return &IdempotencyRecord{Version: IdempotencyVersion, Op: OpAcquire, Digest: digest64, Code: CodeAcquired,
		Lease: validRecord(), BackendTime: UnixMilli(msAcquired)}
}

func TestIdempotencyRecordRoundTrip(t *testing.T) {
	e := validIdem()
	e.Lease.Metadata = Metadata{"k": "v"}
	b, err := e.Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	want := `{"idempotency_version":1,"op":"acquire","digest":"` + digest64 + `","code":"lease_acquired","lease":` +
		strings.Replace(goldenRecordJSON, `"metadata":{}`, `"metadata":{"k":"v"}`, 1) + `,"backend_time":"2026-08-05T12:00:00.000Z"}`
	if string(b) != want {
		t.Fatalf("Encode =\n%s\nwant\n%s", b, want)
	}
	got, err := DecodeIdempotencyRecord(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(got, e) {
		t.Fatalf("round trip:\n%#v\n%#v", got, e)
	}
	res := got.Result()
	if res.Code != CodeAcquired || !res.Replayed || res.Op != OpAcquire || res.BackendTime != UnixMilli(msAcquired) ||
		res.Current != nil || !reflect.DeepEqual(res.Lease, e.Lease) {
		t.Fatalf("Result = %+v", res)
	}
	res.Lease.Metadata["k"] = "changed"
	if got.Lease.Metadata["k"] != "v" {
		t.Fatal("Result shares the stored lease")
	}
	for _, op := range []Op{OpRenew, OpRelease, OpForceRelease, OpRevoke} {
		e := validIdem()
		e.Op, e.Code = op, op.SuccessCode()
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if d, err := DecodeIdempotencyRecord(b); err != nil || d.Op != op {
			t.Fatalf("%s: %v", op, err)
		}
	}
}

func TestIdempotencyRecordFailsClosed(t *testing.T) {
	_, err := (&IdempotencyRecord{Version: 1, Op: OpAcquire, Digest: digest64, Code: CodeAcquired}).Encode()
	wantCorrupt(t, err, "idempotency: invalid evidence")
	bad := validIdem()
	bad.Lease.State = "x"
	_, err = bad.Encode()
	wantCorrupt(t, err, "idempotency: unknown state")
	// A digest is 64 lower-case hex digits, as every writer makes it: 64
	// bytes of anything else (invalid UTF-8 among them, which JSON writes
	// as U+FFFD) would encode evidence that no longer decodes.
	for _, d := range []string{"\xff" + digest64[1:], strings.ToUpper(digest64), strings.Repeat("g", 64), digest64[1:] + "\n"} {
		bad := validIdem()
		bad.Digest = d
		_, err := bad.Encode()
		wantCorrupt(t, err, "idempotency: invalid evidence")
		c := validCommitEvidence()
		c.Digest = d
		if b, err := EncodeCommit(c); err == nil {
			t.Fatalf("commit evidence with digest %q encoded: %s", d, b)
		}
	}

	// An operation's evidence holds its own success, never another's.
	for _, op := range []Op{OpAcquire, OpRenew, OpRelease, OpForceRelease, OpRevoke} {
		for _, code := range []Code{CodeAcquired, CodeRenewed, CodeReleased, CodeForceReleased, CodeRevoked, CodeCommitAuthorized} {
			e := validIdem()
			e.Op, e.Code = op, code
			_, err := e.Encode()
			if code == op.SuccessCode() {
				if err != nil {
					t.Fatalf("%s %s: %v", op, code, err)
				}
				continue
			}
			wantCorrupt(t, err, "idempotency: invalid evidence")
			e.Code = op.SuccessCode()
			b, err := e.Encode()
			if err != nil {
				t.Fatal(err)
			}
			damaged := bytes.Replace(b, []byte(`"code":"`+string(op.SuccessCode())+`"`), []byte(`"code":"`+string(code)+`"`), 1)
			if _, err := DecodeIdempotencyRecord(damaged); CodeOf(err) != CodeCorrupt {
				t.Fatalf("%s evidence with code %s decoded: %v", op, code, err)
			}
		}
	}

	base, err := validIdem().Encode()
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		return mustJSON(t, m)
	}
	cases := []struct {
		name   string
		in     []byte
		reason string
	}{
		{"unknown field", mut(func(m map[string]any) { m["extra"] = 1 }), `idempotency: malformed: unknown field "extra"`},
		{"unknown field in lease", mut(func(m map[string]any) { m["lease"].(map[string]any)["extra"] = 1 }), `idempotency: malformed: unknown field "extra"`},
		{"version 2", mut(func(m map[string]any) { m["idempotency_version"] = 2 }), "idempotency: invalid evidence"},
		{"unknown op", mut(func(m map[string]any) { m["op"] = "inspect" }), "idempotency: invalid evidence"},
		{"error code stored", mut(func(m map[string]any) { m["code"] = "lease_conflict" }), "idempotency: invalid evidence"},
		{"short digest", mut(func(m map[string]any) { m["digest"] = "abc" }), "idempotency: invalid evidence"},
		{"upper-case digest", mut(func(m map[string]any) { m["digest"] = strings.ToUpper(digest64) }), "idempotency: invalid evidence"},
		{"digest of 64 non-hex bytes", mut(func(m map[string]any) { m["digest"] = strings.Repeat("zz", 32) }), "idempotency: invalid evidence"},
		{"no lease", mut(func(m map[string]any) { delete(m, "lease") }), "idempotency: invalid evidence"},
		{"null lease", mut(func(m map[string]any) { m["lease"] = nil }), "idempotency: invalid evidence"},
		{"corrupt lease", mut(func(m map[string]any) { m["lease"].(map[string]any)["fencing_token"] = 0 }), "idempotency: out of range"},
		{"lease with wrong key", mut(func(m map[string]any) { m["lease"].(map[string]any)["target_id"] = "other" }), "idempotency: stored tuple does not hash to lock_key"},
		{"trailing data", append(append([]byte{}, base...), " 1"...), "idempotency: trailing data"},
		{"malformed", base[:20], "idempotency: malformed: invalid JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := DecodeIdempotencyRecord(tc.in)
			if e != nil {
				t.Errorf("returned %+v", e)
			}
			wantCorrupt(t, err, tc.reason)
		})
	}
}

func validHistory() *HistoryEntry {
	r := validRecord()
	r.State = StateRevoked
	return &HistoryEntry{HistoryVersion: HistoryVersion, Record: r, EndedAt: UnixMilli(msRenewed + 1),
		EndedBy: "prn_admin_01", RequestID: "request_09", Reason: "compromised host", IncidentID: "inc_01"}
}

func TestHistoryEntryRoundTrip(t *testing.T) {
	for _, h := range []*HistoryEntry{validHistory(), {HistoryVersion: 1, Record: func() *Record {
		r := validRecord()
		r.State = StateExpired
		return r
	}(), EndedAt: UnixMilli(msExpires)}} {
		b, err := h.Encode()
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		got, err := DecodeHistoryEntry(b)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip:\n%#v\n%#v", got, h)
		}
	}
	b, _ := validHistory().Encode()
	if !strings.HasPrefix(string(b), `{"history_version":1,"record":{"record_version":1,`) ||
		!strings.HasSuffix(string(b), `"state":"revoked"},"ended_at":"2026-08-05T12:00:20.001Z","ended_by":"prn_admin_01","request_id":"request_09","reason":"compromised host","incident_id":"inc_01"}`) {
		t.Fatalf("encoding %s", b)
	}
	// Optional fields are omitted.
	h := validHistory()
	h.EndedBy, h.RequestID, h.Reason, h.IncidentID = "", "", "", ""
	b, _ = h.Encode()
	if strings.Contains(string(b), "ended_by") || strings.Contains(string(b), "incident_id") {
		t.Fatalf("empty optional fields encoded: %s", b)
	}
}

func TestHistoryEntryFailsClosed(t *testing.T) {
	active := validHistory()
	active.Record.State = StateActive
	_, err := active.Encode()
	wantCorrupt(t, err, "history: invalid entry")
	_, err = (&HistoryEntry{HistoryVersion: 1, EndedAt: UnixMilli(1)}).Encode()
	wantCorrupt(t, err, "history: invalid entry")

	base, err := validHistory().Encode()
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		return mustJSON(t, m)
	}
	cases := []struct {
		name   string
		in     []byte
		reason string
	}{
		{"unknown field", mut(func(m map[string]any) { m["note"] = "x" }), `history: malformed: unknown field "note"`},
		{"unknown field in record", mut(func(m map[string]any) { m["record"].(map[string]any)["note"] = "x" }), `history: malformed: unknown field "note"`},
		{"version 2", mut(func(m map[string]any) { m["history_version"] = 2 }), "history: invalid entry"},
		{"active record", mut(func(m map[string]any) { m["record"].(map[string]any)["state"] = "active" }), "history: invalid entry"},
		{"missing record", mut(func(m map[string]any) { delete(m, "record") }), "history: invalid entry"},
		{"missing ended_at", mut(func(m map[string]any) { delete(m, "ended_at") }), "history: invalid entry"},
		{"bad ended_at", mut(func(m map[string]any) { m["ended_at"] = "2026-08-05T12:00:20Z" }), "history: malformed: invalid JSON"},
		{"corrupt record", mut(func(m map[string]any) { m["record"].(map[string]any)["ttl_ms"] = 0 }), "history: out of range"},
		{"trailing data", append(append([]byte{}, base...), "[]"...), "history: trailing data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := DecodeHistoryEntry(tc.in)
			if h != nil {
				t.Errorf("returned %+v", h)
			}
			wantCorrupt(t, err, tc.reason)
		})
	}
}

func validCommitEvidence() Commit {
	return Commit{Sink: "couchdb-targets", CommitID: "commit_01", LeaseID: "lease_01", FencingToken: 42,
		ExecutionID: "execution_01", JobID: "job_01", TraceID: "trace_01", Target: "doc:target_01", PayloadSHA256: digest64,
		Seq: 7, AcceptedAt: UnixMilli(msRenewed), Digest: digest64}
}

func TestCommitRoundTrip(t *testing.T) {
	c := validCommitEvidence()
	b, err := EncodeCommit(c)
	if err != nil {
		t.Fatalf("EncodeCommit: %v", err)
	}
	want := `{"commit_version":2,"sink":"couchdb-targets","commit_id":"commit_01","lease_id":"lease_01","fencing_token":42,` +
		`"execution_id":"execution_01","job_id":"job_01","trace_id":"trace_01","target":"doc:target_01","payload_sha256":"` + digest64 + `",` +
		`"commit_seq":7,"accepted_at":"2026-08-05T12:00:20.000Z","digest":"` + digest64 + `"}`
	if string(b) != want {
		t.Fatalf("EncodeCommit =\n%s\nwant\n%s", b, want)
	}
	got, err := DecodeCommit(b)
	if err != nil || got != c {
		t.Fatalf("DecodeCommit = %+v, %v", got, err)
	}
	c.TraceID = ""
	b, _ = EncodeCommit(c)
	if strings.Contains(string(b), "trace_id") {
		t.Fatalf("empty trace encoded: %s", b)
	}
	if got, err := DecodeCommit(b); err != nil || got != c {
		t.Fatalf("no trace: %+v %v", got, err)
	}
	c.PayloadSHA256 = ""
	b, _ = EncodeCommit(c)
	if got, err := DecodeCommit(b); err != nil || got != c || strings.Contains(string(b), "payload_sha256") {
		t.Fatalf("no payload digest: %s %+v %v", b, got, err)
	}
	if _, err := EncodeCommit(Commit{}); err == nil {
		t.Fatal("commit without accepted_at encoded")
	}
	for _, unbound := range []func(*Commit){func(c *Commit) { c.Target = "" }, func(c *Commit) { c.JobID = "" }} {
		c := validCommitEvidence()
		unbound(&c)
		if b, err := EncodeCommit(c); err == nil {
			t.Fatalf("a commit not bound to its write and job encoded: %s", b)
		}
	}
	// Evidence of version 1, written before commits were bound to a write,
	// still reads (a replay of it then conflicts: its digest differs).
	v1 := `{"commit_version":1,"sink":"couchdb-targets","commit_id":"commit_01","lease_id":"lease_01","fencing_token":42,` +
		`"execution_id":"execution_01","trace_id":"trace_01","accepted_at":"2026-08-05T12:00:20.000Z","digest":"` + digest64 + `"}`
	old := validCommitEvidence()
	old.JobID, old.Target, old.PayloadSHA256, old.Seq = "", "", "", 0
	if got, err := DecodeCommit([]byte(v1)); err != nil || got != old {
		t.Fatalf("version 1 evidence: %+v %v", got, err)
	}
	withTarget := strings.Replace(v1, `"trace_id":"trace_01",`, `"trace_id":"trace_01","target":"doc:x",`, 1)
	if _, err := DecodeCommit([]byte(withTarget)); err == nil {
		t.Fatal("version 1 evidence with a target decoded")
	}
}

func TestCommitFailsClosed(t *testing.T) {
	base, _ := EncodeCommit(validCommitEvidence())
	mut := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		return mustJSON(t, m)
	}
	cases := []struct {
		name   string
		in     []byte
		reason string
	}{
		{"unknown field", mut(func(m map[string]any) { m["owner"] = "x" }), `commit: malformed: unknown field "owner"`},
		{"version 3", mut(func(m map[string]any) { m["commit_version"] = 3 }), "commit: invalid evidence"},
		{"version 1 with a binding", mut(func(m map[string]any) { m["commit_version"] = 1 }), "commit: invalid evidence"},
		{"no target", mut(func(m map[string]any) { delete(m, "target") }), "commit: the write this commit is for is required"},
		{"no job", mut(func(m map[string]any) { delete(m, "job_id") }), "commit: must not be empty"},
		{"bad payload digest", mut(func(m map[string]any) { m["payload_sha256"] = "AB" }), "commit: must be 64 lower-case hex digits"},
		{"no commit seq", mut(func(m map[string]any) { delete(m, "commit_seq") }), "commit: invalid evidence"},
		{"commit seq 2^53", mut(func(m map[string]any) { m["commit_seq"] = json.Number("9007199254740992") }), "commit: invalid evidence"},
		{"version missing", mut(func(m map[string]any) { delete(m, "commit_version") }), "commit: invalid evidence"},
		{"token 0", mut(func(m map[string]any) { m["fencing_token"] = 0 }), "commit: invalid evidence"},
		{"token 2^53", mut(func(m map[string]any) { m["fencing_token"] = json.Number("9007199254740992") }), "commit: invalid evidence"},
		{"no accepted_at", mut(func(m map[string]any) { delete(m, "accepted_at") }), "commit: invalid evidence"},
		{"short digest", mut(func(m map[string]any) { m["digest"] = "ab" }), "commit: invalid evidence"},
		{"upper-case digest", mut(func(m map[string]any) { m["digest"] = strings.ToUpper(digest64) }), "commit: invalid evidence"},
		{"trailing", append(append([]byte{}, base...), "x"...), "commit: trailing data"},
		{"malformed", []byte(`{"commit_version":`), "commit: malformed: invalid JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeCommit(tc.in)
			if c != (Commit{}) {
				t.Errorf("returned %+v", c)
			}
			wantCorrupt(t, err, tc.reason)
		})
	}
}

func TestNewLeaseID(t *testing.T) {
	re := regexp.MustCompile(`^lease_[0-9A-HJKMNP-TV-Z]{26}$`)
	seen := map[string]bool{}
	var ids []string
	for i := int64(0); i < 50; i++ {
		id := NewLeaseID(UnixMilli(msAcquired + i*1000))
		if !re.MatchString(id) {
			t.Fatalf("lease id %q", id)
		}
		if err := CheckOpaqueID("lease_id", id); err != nil {
			t.Fatalf("lease id %q fails the opaque id rule: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("duplicate %q", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	if !sort.StringsAreSorted(ids) {
		t.Fatal("lease ids do not sort by acquisition time")
	}
	a, b := NewLeaseID(UnixMilli(msAcquired)), NewLeaseID(UnixMilli(msAcquired))
	if a == b || a[:16] != b[:16] {
		t.Fatalf("same-millisecond ids %q %q: want equal time part, distinct random part", a, b)
	}
}

// Stored evidence missing a required member must fail closed like a record.
func TestEvidenceDecodersRequireEveryField(t *testing.T) {
	var accepted []string

	b, err := validIdem().Encode()
	if err != nil {
		t.Fatal(err)
	}
	noTime := strings.Replace(string(b), `,"backend_time":"2026-08-05T12:00:00.000Z"`, "", 1)
	if noTime == string(b) {
		t.Fatal("fixture did not drop backend_time")
	}
	if _, err := DecodeIdempotencyRecord([]byte(noTime)); err == nil {
		accepted = append(accepted, "idempotency evidence without backend_time (evidence.go DecodeIdempotencyRecord: add e.BackendTime.IsZero() to the invalid-evidence check)")
	} else {
		wantErr(t, err, CodeCorrupt, "", "")
	}

	var badCommit []string
	for _, f := range []struct {
		name string
		mut  func(*Commit)
	}{
		{"sink", func(c *Commit) { c.Sink = "" }},
		{"commit_id", func(c *Commit) { c.CommitID = "" }},
		{"lease_id", func(c *Commit) { c.LeaseID = "" }},
		{"execution_id", func(c *Commit) { c.ExecutionID = "" }},
		{"lease_id syntax", func(c *Commit) { c.LeaseID = "lease/01*" }},
	} {
		c := validCommitEvidence()
		f.mut(&c)
		if _, err := EncodeCommit(c); err == nil {
			badCommit = append(badCommit, f.name+" (encoder)")
		}
		b, err := json.Marshal(commitEvidence{Version: CommitVersion, Commit: c})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeCommit(b); err == nil {
			badCommit = append(badCommit, f.name)
		} else {
			wantErr(t, err, CodeCorrupt, "", "")
		}
	}
	if len(badCommit) > 0 {
		accepted = append(accepted, "commit evidence with empty/invalid "+strings.Join(badCommit, ", ")+
			" (evidence.go DecodeCommit: check sink with NormalizeIdentifier and commit_id, lease_id, execution_id, optional trace_id with CheckOpaqueID)")
	}
	if len(accepted) > 0 {
		t.Fatalf("BUG: decoders accept incomplete evidence: %s", strings.Join(accepted, "; "))
	}
}

// An encoder must refuse what its own strict decoder would reject, so a
// backend bug surfaces at write time instead of making evidence unreadable.
func TestEvidenceEncodersRejectWhatDecodersReject(t *testing.T) {
	var encoded []string
	idem := []struct {
		name string
		mut  func(*IdempotencyRecord)
	}{
		{"version 0", func(e *IdempotencyRecord) { e.Version = 0 }},
		{"unknown op", func(e *IdempotencyRecord) { e.Op = "inspect" }},
		{"error code", func(e *IdempotencyRecord) { e.Code = CodeConflict }},
		{"short digest", func(e *IdempotencyRecord) { e.Digest = "ab" }},
	}
	for _, c := range idem {
		e := validIdem()
		c.mut(e)
		b, err := e.Encode()
		if err != nil {
			continue
		}
		if _, derr := DecodeIdempotencyRecord(b); derr == nil {
			t.Fatalf("%s: decoder accepted it too", c.name)
		}
		encoded = append(encoded, "IdempotencyRecord "+c.name)
	}
	h := validHistory()
	h.HistoryVersion = 0
	if b, err := h.Encode(); err == nil {
		if _, derr := DecodeHistoryEntry(b); derr == nil {
			t.Fatal("history version 0 decoded")
		}
		encoded = append(encoded, "HistoryEntry version 0")
	}
	for name, c := range map[string]Commit{
		"token 0":      func() Commit { c := validCommitEvidence(); c.FencingToken = 0; return c }(),
		"short digest": func() Commit { c := validCommitEvidence(); c.Digest = "ab"; return c }(),
	} {
		if b, err := EncodeCommit(c); err == nil {
			if _, derr := DecodeCommit(b); derr == nil {
				t.Fatalf("commit %s decoded", name)
			}
			encoded = append(encoded, "Commit "+name)
		}
	}
	sort.Strings(encoded)
	if len(encoded) > 0 {
		t.Fatalf("BUG: evidence.go encoders write evidence their decoders reject: %s "+
			"(run the decoder's invariant check in IdempotencyRecord.Encode, HistoryEntry.Encode and EncodeCommit)",
			strings.Join(encoded, ", "))
	}
}

// Stored evidence is read only in the exact bytes its encoder writes, as
// records are: a valid value spelled any other way fails closed.
func TestStoredEvidenceIsCanonicalOnly(t *testing.T) {
	idem, _ := validIdem().Encode()
	hist, _ := validHistory().Encode()
	commit, _ := EncodeCommit(validCommitEvidence())
	decoders := []struct {
		prefix string
		b      []byte
		decode func([]byte) error
	}{
		{"idempotency", idem, func(b []byte) error { _, err := DecodeIdempotencyRecord(b); return err }},
		{"history", hist, func(b []byte) error { _, err := DecodeHistoryEntry(b); return err }},
		{"commit", commit, func(b []byte) error { _, err := DecodeCommit(b); return err }},
	}
	for _, d := range decoders {
		if err := d.decode(d.b); err != nil {
			t.Fatalf("%s: canonical bytes refused: %v", d.prefix, err)
		}
		reordered := func() []byte {
			var m map[string]any
			if err := json.Unmarshal(d.b, &m); err != nil {
				t.Fatal(err)
			}
			return mustJSON(t, m)
		}()
		for name, b := range map[string][]byte{
			"trailing whitespace":     append(append([]byte{}, d.b...), ' '),
			"leading whitespace":      append([]byte(" "), d.b...),
			"fields in another order": reordered,
			"escaped letter":          []byte(strings.Replace(string(d.b), `"lease_01"`, `"lease\u005f01"`, 1)),
		} {
			t.Run(d.prefix+"/"+name, func(t *testing.T) { wantCorrupt(t, d.decode(b), d.prefix+": not in canonical form") })
		}
		// Not UTF-8: refused before anything is decoded.
		bad := []byte(strings.Replace(string(d.b), `"lease_01"`, "\"lease_\xff\"", 1))
		wantCorrupt(t, d.decode(bad), d.prefix+": malformed: not valid UTF-8")
	}
}
