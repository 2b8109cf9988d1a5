package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/starintel/starlease/lease"
)

// RedactionKeyPurpose names the key a server derives from its pepper for
// its Redactor (auth.Pepper.DeriveKey), so every server sharing a pepper
// gives a value the same redacted form.
const RedactionKeyPurpose = "audit-redaction/v1"

// Redacted is the prefix of a redacted value; Redacted alone is the form
// a value takes when no key is at hand (Marshal's floor).
const Redacted = "redacted"

// redactedHexLen is how much of the HMAC a redacted value keeps: 128 bits,
// far from the 64 hex digits that would make it secret-shaped itself.
const redactedHexLen = 32

// Redactor gives an event's values that may be credential material a form
// that is safe to store. The rule is lease.SecretShaped, applied to every
// string field alike: a value containing "star_sk_", "bearer " or a run of
// 64 hex digits is replaced, whole, by "redacted:" and the first 128 bits
// of HMAC-SHA-256 under the server's key, in hex.
//
// A bare 64-hex identifier is redacted too, though most are not
// credentials (a target id is often a SHA-256 of a URL): the secret part
// of an API key is exactly 64 hex digits, and nothing in the value tells
// the two apart. The keyed hash keeps such a value usable — the same value
// gives the same redacted form in every event, so events still correlate,
// and an operator holding the pepper can compute the form of a known id
// (Redactor.Value) to search for it — while the value itself is never
// stored. It is never a plain hash: a plain hash of a would-be secret can
// be tested offline, a keyed one cannot without the key. The lease id of
// the event leads an authorized reader to the record and its identity.
//
// Redaction replaces, it never refuses: a caller's choice of value can
// never make an event invalid and so never suppress it or block the
// operation it records.
type Redactor struct{ key []byte }

// NewRedactor returns a Redactor keyed by key (at least 32 bytes, copied).
func NewRedactor(key []byte) (*Redactor, error) {
	if len(key) < 32 {
		return nil, errors.New("audit: a redaction key needs at least 32 bytes")
	}
	return &Redactor{key: append([]byte(nil), key...)}, nil
}

// Value returns v, or its redacted form when lease.SecretShaped(v) or when
// v already has a redacted form ("redacted" or "redacted:" and 32 hex
// digits, in any case): a caller's literal of that form is a value like any
// other, hashed, so it can never pass for a redaction (forge an event that
// reads as concerning another value). A nil Redactor has no key and gives
// Redacted alone.
func (r *Redactor) Value(v string) string {
	if !lease.SecretShaped(v) && !redactedForm(v) {
		return v
	}
	return r.redact(v)
}

// redact is v's redacted form, whether or not v needs one.
func (r *Redactor) redact(v string) string {
	if r == nil {
		return Redacted
	}
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(v))
	return Redacted + ":" + hex.EncodeToString(m.Sum(nil))[:redactedHexLen]
}

// redactedForm reports whether v reads as a redaction: "redacted", or
// "redacted:" and 32 hex digits, without regard to case.
func redactedForm(v string) bool {
	if strings.EqualFold(v, Redacted) {
		return true
	}
	p := len(Redacted) + 1
	if len(v) != p+redactedHexLen || !strings.EqualFold(v[:p], Redacted+":") {
		return false
	}
	for i := p; i < len(v); i++ {
		c := v[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// Event redacts every string field of e in place (see Value). It is done
// once: an event a keyed Redactor already redacted keeps its forms (its
// own "redacted:…" values are not hashed again).
func (r *Redactor) Event(e *Event) {
	if e.keyed {
		return
	}
	for _, p := range e.strPtrs() {
		*p = r.Value(*p)
	}
	e.keyed = r != nil
}

// floorRedact is Marshal's floor: a value that may be credential material
// becomes Redacted. Values already in a redacted form are left as they are
// (a keyed Redactor, or the event's earlier encoding, gave them), so an
// event read back and written again keeps them.
func floorRedact(e *Event) {
	for _, p := range e.strPtrs() {
		if lease.SecretShaped(*p) {
			*p = Redacted
		}
	}
}

func (e *Event) strPtrs() []*string {
	return []*string{
		&e.EventID, &e.RequestID, &e.CorrelationID, &e.TraceID, &e.ExecutionID, &e.JobID,
		&e.PrincipalClass, &e.PrincipalID, &e.CredentialID, &e.ServiceInstanceID,
		&e.TenantID, &e.ProgramID, &e.TargetNamespace, &e.TargetID, &e.ActorName, &e.WorkflowName,
		&e.OperationClass, &e.LeaseID, &e.DeadlineClass, &e.Reason, &e.IncidentID,
	}
}
