package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"

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

// Value returns v, or its redacted form when lease.SecretShaped(v). A nil
// Redactor has no key and gives Redacted alone.
func (r *Redactor) Value(v string) string {
	if !lease.SecretShaped(v) {
		return v
	}
	if r == nil {
		return Redacted
	}
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(v))
	return Redacted + ":" + hex.EncodeToString(m.Sum(nil))[:redactedHexLen]
}

// Event redacts every string field of e in place (see Value).
func (r *Redactor) Event(e *Event) {
	for _, p := range []*string{
		&e.EventID, &e.RequestID, &e.CorrelationID, &e.TraceID, &e.ExecutionID, &e.JobID,
		&e.PrincipalClass, &e.PrincipalID, &e.CredentialID, &e.ServiceInstanceID,
		&e.TenantID, &e.ProgramID, &e.TargetNamespace, &e.TargetID, &e.ActorName, &e.WorkflowName,
		&e.OperationClass, &e.LeaseID, &e.DeadlineClass, &e.Reason, &e.IncidentID,
	} {
		*p = r.Value(*p)
	}
}
