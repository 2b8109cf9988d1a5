package lease

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"
)

// decodeCanonicalRecord reads b only if b is exactly the bytes
// Record.Encode writes (fields in declaration order, no whitespace,
// strings encoding/json writes verbatim, numbers in plain decimal,
// metadata in its canonical encoding) and the record is valid; it then
// returns what the strict path would, at a fraction of the cost. Anything
// else, however close, returns false.
//
// Why the answers agree: the strict path decodes b, and a record's
// canonical bytes decode to that same record; its re-encoding then equals
// b, so no key check is needed, and both paths finish with the same
// validateStored.
func decodeCanonicalRecord(b []byte) (*Record, bool) {
	p := canonicalReader{b: b}
	var r Record
	if !p.lit(`{"record_version":1,"lock_key":`) {
		return nil, false
	}
	r.RecordVersion = 1
	ok := p.str(&r.LockKey) &&
		p.lit(`,"tenant_id":`) && p.str(&r.TenantID) &&
		p.lit(`,"program_id":`) && p.str(&r.ProgramID) &&
		p.lit(`,"target_namespace":`) && p.str(&r.TargetNamespace) &&
		p.lit(`,"target_id":`) && p.str(&r.TargetID) &&
		p.lit(`,"actor_name":`) && p.str(&r.ActorName) &&
		p.lit(`,"workflow_name":`) && p.str(&r.WorkflowName) &&
		p.lit(`,"operation_class":`) && p.str(&r.OperationClass) &&
		p.lit(`,"lease_id":`) && p.str(&r.LeaseID) &&
		p.lit(`,"owner_principal_id":`) && p.str(&r.OwnerPrincipalID) &&
		p.lit(`,"owner_client_id":`) && p.str(&r.OwnerClientID) &&
		p.lit(`,"owner_credential_id":`) && p.str(&r.OwnerCredentialID) &&
		p.lit(`,"service_instance_id":`) && p.str(&r.ServiceInstanceID) &&
		p.lit(`,"fencing_token":`) && p.uint(&r.FencingToken) &&
		p.lit(`,"acquired_at":`) && p.ts(&r.AcquiredAt) &&
		p.lit(`,"renewed_at":`) && p.ts(&r.RenewedAt) &&
		p.lit(`,"expires_at":`) && p.ts(&r.ExpiresAt) &&
		p.lit(`,"ttl_ms":`) && p.int(&r.TTLMs) &&
		p.lit(`,"maximum_lifetime_ms":`) && p.int(&r.MaximumLifetimeMs) &&
		p.lit(`,"execution_id":`) && p.str(&r.ExecutionID) &&
		p.lit(`,"job_id":`) && p.str(&r.JobID) &&
		p.lit(`,"trace_id":`) && p.str(&r.TraceID) &&
		p.lit(`,"request_id":`) && p.str(&r.RequestID) &&
		p.lit(`,"metadata":`) && p.metadataAndState(&r)
	if !ok || r.validateStored() != nil {
		return nil, false
	}
	return &r, true
}

// canonicalReader walks b from off; each method consumes one canonical
// token or reports false.
type canonicalReader struct {
	b   []byte
	off int
}

func (p *canonicalReader) lit(s string) bool {
	if len(p.b)-p.off < len(s) || string(p.b[p.off:p.off+len(s)]) != s {
		return false
	}
	p.off += len(s)
	return true
}

// verbatim reports a byte encoding/json writes as itself inside a string:
// printable ASCII except the quote, the backslash and the HTML characters
// it escapes.
func verbatim(c byte) bool {
	return c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

// str reads a string encoding/json writes verbatim: printable ASCII it
// does not escape, and valid UTF-8 other than U+2028 and U+2029 (which it
// escapes). Identity components may be non-ASCII letters.
func (p *canonicalReader) str(dst *string) bool {
	if p.off >= len(p.b) || p.b[p.off] != '"' {
		return false
	}
	for i := p.off + 1; i < len(p.b); {
		c := p.b[i]
		switch {
		case c == '"':
			*dst = string(p.b[p.off+1 : i])
			p.off = i + 1
			return true
		case c < utf8.RuneSelf:
			if !verbatim(c) {
				return false
			}
			i++
		default:
			r, n := utf8.DecodeRune(p.b[i:])
			if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
				return false
			}
			i += n
		}
	}
	return false
}

// digits reads a plain decimal (no sign, no leading zero) of at most 16
// digits, which covers every bound a record's numbers have (2^53-1).
func (p *canonicalReader) digits() (uint64, bool) {
	start := p.off
	var v uint64
	for p.off < len(p.b) && p.b[p.off] >= '0' && p.b[p.off] <= '9' {
		v = v*10 + uint64(p.b[p.off]-'0')
		p.off++
	}
	n := p.off - start
	if n == 0 || n > 16 || (n > 1 && p.b[start] == '0') {
		return 0, false
	}
	return v, true
}

func (p *canonicalReader) uint(dst *uint64) bool {
	v, ok := p.digits()
	*dst = v
	return ok
}

func (p *canonicalReader) int(dst *int64) bool {
	v, ok := p.digits()
	*dst = int64(v)
	return ok
}

// ts reads a timestamp as Timestamp.UnmarshalJSON does, without its
// allocations: it accepts exactly the texts ParseTimestamp accepts (the
// layout, every field in range, a day the month has) and gives the same
// instant.
func (p *canonicalReader) ts(dst *Timestamp) bool {
	const n = len(`"2006-01-02T15:04:05.000Z"`)
	if len(p.b)-p.off < n {
		return false
	}
	s := p.b[p.off : p.off+n]
	if s[0] != '"' || s[5] != '-' || s[8] != '-' || s[11] != 'T' || s[14] != ':' || s[17] != ':' ||
		s[20] != '.' || s[24] != 'Z' || s[25] != '"' {
		return false
	}
	num := func(from, to int) (int, bool) {
		v := 0
		for _, c := range s[from:to] {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	y, ok1 := num(1, 5)
	mo, ok2 := num(6, 8)
	d, ok3 := num(9, 11)
	h, ok4 := num(12, 14)
	mi, ok5 := num(15, 17)
	sec, ok6 := num(18, 20)
	ms, ok7 := num(21, 24)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || sec > 59 {
		return false
	}
	t := time.Date(y, time.Month(mo), d, h, mi, sec, ms*int(time.Millisecond), time.UTC)
	if t.Day() != d { // past the month's last day: time.Date normalized it
		return false
	}
	*dst = Timestamp{t}
	p.off += n
	return true
}

// stateTails are the record's possible endings, after the metadata.
var stateTails = [...]struct {
	tail  string
	state State
}{
	{`,"state":"active"}`, StateActive},
	{`,"state":"expired"}`, StateExpired},
	{`,"state":"released"}`, StateReleased},
	{`,"state":"revoked"}`, StateRevoked},
}

// metadataAndState reads the rest of the record: the metadata object,
// accepted only in its canonical encoding, then the state ending b.
func (p *canonicalReader) metadataAndState(r *Record) bool {
	rest := p.b[p.off:]
	for _, st := range stateTails {
		meta, found := bytes.CutSuffix(rest, []byte(st.tail))
		if !found {
			continue
		}
		if string(meta) == "{}" {
			r.Metadata = Metadata{}
		} else {
			if len(meta) == 0 || meta[0] != '{' || strictUnmarshal(meta, &r.Metadata) != nil || r.Metadata == nil {
				return false
			}
			if again, err := json.Marshal(r.Metadata); err != nil || !bytes.Equal(again, meta) {
				return false
			}
		}
		r.State = st.state
		p.off = len(p.b)
		return true
	}
	return false
}

// decodeCanonicalHistory is decodeCanonicalRecord for a history entry:
// the entry's exact encoding, its record read by decodeCanonicalRecord.
// The record ends where the entry's last `,"ended_at":"` begins: no string
// of a canonical encoding holds a bare quote, and what follows ended_at is
// strings only, so that text cannot occur later inside a value.
func decodeCanonicalHistory(b []byte) (*HistoryEntry, bool) {
	const head = `{"history_version":1,"record":`
	if !bytes.HasPrefix(b, []byte(head)) {
		return nil, false
	}
	end := bytes.LastIndex(b, []byte(`,"ended_at":"`))
	if end < len(head) {
		return nil, false
	}
	rec, ok := decodeCanonicalRecord(b[len(head):end])
	if !ok {
		return nil, false
	}
	h := HistoryEntry{HistoryVersion: 1, Record: rec}
	p := canonicalReader{b: b, off: end}
	if !p.lit(`,"ended_at":`) || !p.ts(&h.EndedAt) {
		return nil, false
	}
	// The optional members, in order, each present only when not empty.
	for _, f := range [...]struct {
		name string
		dst  *string
	}{{`,"ended_by":`, &h.EndedBy}, {`,"request_id":`, &h.RequestID}, {`,"reason":`, &h.Reason}, {`,"incident_id":`, &h.IncidentID}} {
		if p.lit(f.name) && (!p.str(f.dst) || *f.dst == "") {
			return nil, false
		}
	}
	if !p.lit(`}`) || p.off != len(b) || h.validate(true) != nil {
		return nil, false
	}
	return &h, true
}
