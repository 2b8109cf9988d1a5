package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
)

var redactedRE = regexp.MustCompile(`^redacted:[0-9a-f]{32}$`)

// Issue 11 §2: a caller-chosen value that may be credential material is
// redacted, never a reason to refuse the event — in every field alike.
func TestRedactionNeverRefuses(t *testing.T) {
	key := "star_sk_v1_" + ulid.Make().String() + "_" + strings.Repeat("ab", 32)
	digest := sha256.Sum256([]byte("https://example.com/login"))
	hostile := map[string]string{
		"sha-256 digest": hex.EncodeToString(digest[:]),
		"upper-case hex": strings.Repeat("AB", 32),
		"api key":        key,
		"key prefix":     "STAR_SK_V1_X",
	}
	reasons := map[string]string{
		"bearer":        "header was Bearer abc",
		"bearer lower":  "bearer abc",
		"quoted digest": "url hash " + hostile["sha-256 digest"] + " misrouted",
		"api key":       "leaked " + key,
	}
	r, err := NewRedactor(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewRedactor(bytes.Repeat([]byte{8}, 32))
	type setter struct {
		name string
		set  func(*Event, string)
		get  func(*Event) string
	}
	fields := []setter{
		{"request_id", func(e *Event, v string) { e.RequestID = v }, func(e *Event) string { return e.RequestID }},
		{"correlation_id", func(e *Event, v string) { e.CorrelationID = v }, func(e *Event) string { return e.CorrelationID }},
		{"trace_id", func(e *Event, v string) { e.TraceID = v }, func(e *Event) string { return e.TraceID }},
		{"execution_id", func(e *Event, v string) { e.ExecutionID = v }, func(e *Event) string { return e.ExecutionID }},
		{"job_id", func(e *Event, v string) { e.JobID = v }, func(e *Event) string { return e.JobID }},
		{"service_instance_id", func(e *Event, v string) { e.ServiceInstanceID = v }, func(e *Event) string { return e.ServiceInstanceID }},
		{"incident_id", func(e *Event, v string) { e.IncidentID = v }, func(e *Event) string { return e.IncidentID }},
		{"target_id", func(e *Event, v string) { e.TargetID = strings.ToLower(v) }, func(e *Event) string { return e.TargetID }},
		{"tenant_id", func(e *Event, v string) { e.TenantID = strings.ToLower(v) }, func(e *Event) string { return e.TenantID }},
	}
	for hname, v := range hostile {
		for _, f := range fields {
			t.Run(hname+"/"+f.name, func(t *testing.T) {
				e := revokeEvent(t0)
				f.set(&e, v)
				sent := f.get(&e)
				// Validate no longer looks for credential material.
				if err := e.Validate(); err != nil {
					t.Fatalf("Validate refused a caller's value: %v", err)
				}
				// Marshal, the floor, writes it as "redacted".
				b, err := Marshal(e)
				if err != nil {
					t.Fatalf("Marshal refused a caller's value: %v", err)
				}
				if bytes.Contains(bytes.ToLower(b), bytes.ToLower([]byte(sent))) || !bytes.Contains(b, []byte(`"`+Redacted+`"`)) {
					t.Fatalf("Marshal wrote %s", b)
				}
				// The keyed redactor: a stable keyed hash, no plain hash.
				k := e
				r.Event(&k)
				got := f.get(&k)
				plain := sha256.Sum256([]byte(sent))
				if !redactedRE.MatchString(got) || got != r.Value(sent) || got == other.Value(sent) ||
					strings.Contains(got, hex.EncodeToString(plain[:])[:32]) {
					t.Fatalf("keyed form %q", got)
				}
				b, err = Marshal(k)
				if err != nil {
					t.Fatal(err)
				}
				back, err := Unmarshal(b)
				if err != nil || f.get(&back) != got {
					t.Fatalf("round trip: %v, %q", err, f.get(&back))
				}
			})
		}
	}
	for name, reason := range reasons {
		e := revokeEvent(t0)
		e.Reason, e.IncidentID = reason, ""
		r.Event(&e)
		if !redactedRE.MatchString(e.Reason) {
			t.Errorf("reason %s redacted to %q", name, e.Reason)
		}
		if _, err := Marshal(e); err != nil {
			t.Errorf("an allowed revoke whose reason was redacted is refused: %v", err)
		}
	}
	// Values that are not secret-shaped stay as they are.
	e := acquireEvent(t0)
	want := e
	r.Event(&e)
	if e.TargetID != want.TargetID || e.RequestID != want.RequestID || e.Reason != want.Reason {
		t.Fatalf("redaction changed ordinary values: %+v", e)
	}
	if r.Value(strings.Repeat("a", 63)) != strings.Repeat("a", 63) {
		t.Fatal("63 hex digits are not secret-shaped")
	}
	if _, err := NewRedactor(make([]byte, 31)); err == nil {
		t.Fatal("a short redaction key was accepted")
	}
}

// TestRedactedFormLiteralIsHashedNotKept guarantees that a caller cannot
// forge a redaction: a literal value of the redacted form ("redacted:" and
// 32 hex, or "redacted") is hashed like any value that may be credential
// material, so it never reads as the redacted form of another value.
func TestRedactedFormLiteralIsHashedNotKept(t *testing.T) {
	r, err := NewRedactor(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	real := strings.Repeat("0f", 32) // a target id that is a SHA-256
	forged := r.Value(real)          // the form an operator report shows
	if _, err := lease.NormalizeIdentifier("target_id", forged); err != nil {
		t.Skipf("redacted form is not a valid identifier: %v", err)
	}
	a, b := acquireEvent(t0), acquireEvent(t0)
	a.TargetID, b.TargetID = real, forged
	r.Event(&a)
	r.Event(&b)
	if a.TargetID == b.TargetID {
		t.Fatalf("a literal target id %q is audited exactly like the redacted 64-hex target: indistinguishable", forged)
	}
}

// TestRedactedLiteralFormsAreHashedOnceAndKeptByMarshal guarantees that a
// literal "redacted" or "redacted:<32 hex>" (any case) is replaced by its
// keyed hash; that a keyed Redactor's own forms are kept by a second pass
// and by Marshal's floor, and survive a round trip through the encoding.
func TestRedactedLiteralFormsAreHashedOnceAndKeptByMarshal(t *testing.T) {
	r, err := NewRedactor(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	for _, lit := range []string{"redacted", "REDACTED", "redacted:" + strings.Repeat("ab", 16), "Redacted:" + strings.Repeat("AB", 16)} {
		e := revokeEvent(t0)
		e.RequestID, e.IncidentID, e.Reason = lit, lit, lit
		r.Event(&e)
		want := r.Value(lit)
		if want == lit || !redactedRE.MatchString(want) {
			t.Fatalf("Value(%q) = %q, want a keyed hash", lit, want)
		}
		if e.RequestID != want || e.IncidentID != want || e.Reason != want {
			t.Fatalf("%q: event holds %q %q %q, want %q", lit, e.RequestID, e.IncidentID, e.Reason, want)
		}
		r.Event(&e) // a second pass keeps the forms
		if e.RequestID != want {
			t.Fatalf("a second Redactor pass changed %q to %q", want, e.RequestID)
		}
		b, err := Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if back.RequestID != want || back.Reason != want {
			t.Fatalf("the encoding changed %q to %q", want, back.RequestID)
		}
	}
	// Not of the form: kept.
	for _, v := range []string{"redacted:" + strings.Repeat("ab", 15), "redacted-1", "not-redacted"} {
		if got := r.Value(v); got != v {
			t.Fatalf("Value(%q) = %q, want it kept", v, got)
		}
	}
}
