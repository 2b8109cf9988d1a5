package auth

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/starintel/starlease/lease"
)

// RecordVersion is the version of the stored credential record.
const RecordVersion = 1

const (
	// SaltLen is the length of a credential's random salt.
	SaltLen = 16
	// MaxLabelBytes bounds a credential's label.
	MaxLabelBytes = 128
)

// ErrCorrupt reports a stored credential record that fails strict decoding.
var ErrCorrupt = errors.New("auth: corrupt credential record")

// Credential is a stored credential. Its salt, verifier and authority MAC
// are unexported: they are written only by Issue and Rotate and read only
// by the Authenticator and the record codec (EncodeCredential,
// DecodeCredential).
//
// The verifier is HMAC-SHA-256(pepper, salt ‖ secret). The authority MAC is
// HMAC-SHA-256(pepper, the fields that grant authority: id, principal,
// class, client, capabilities, scope, created_at, expires_at, salt and
// verifier), so that someone who can write the store but lacks the pepper
// cannot raise a credential's class, capabilities, scope or lifetime, nor
// move a verifier to another credential. Revocation, replacement and the
// label are not covered (Revoke runs without the pepper).
// Credential never prints them: String, every fmt verb, JSON and slog all
// show the redacted Public view.
type Credential struct {
	// ID is the credential id: a ULID, the non-secret part of the key.
	ID string
	// PrincipalID is the principal the credential authenticates.
	PrincipalID string
	Class       Class
	// ClientID names the client application (owner_client_id of leases).
	ClientID     string
	Capabilities []Capability
	Scope        Scope
	CreatedAt    time.Time
	// ExpiresAt is zero for a credential that does not expire.
	ExpiresAt time.Time
	// RevokedAt is zero while the credential is not revoked.
	RevokedAt time.Time
	// ReplacedBy is the id of the credential that replaced this one in a
	// rotation.
	ReplacedBy string
	// Label is a short operator note.
	Label string

	salt     []byte
	verifier []byte
	mac      []byte
}

// Status is a credential's state at some time.
type Status string

// Credential states.
const (
	StatusActive  Status = "active"
	StatusExpired Status = "expired"
	StatusRevoked Status = "revoked"
)

// Status reports the credential's state at now. Revocation wins over
// expiry; a credential expires at ExpiresAt exactly.
func (c Credential) Status(now time.Time) Status {
	switch {
	case !c.RevokedAt.IsZero():
		return StatusRevoked
	case !c.ExpiresAt.IsZero() && !now.Before(c.ExpiresAt):
		return StatusExpired
	}
	return StatusActive
}

// PublicCredential is the display view of a credential: no salt, no
// verifier, no key.
type PublicCredential struct {
	ID           string       `json:"credential_id"`
	PrincipalID  string       `json:"principal_id"`
	Class        Class        `json:"class"`
	ClientID     string       `json:"client_id"`
	Capabilities []Capability `json:"capabilities"`
	Scope        Scope        `json:"scope"`
	CreatedAt    time.Time    `json:"created_at"`
	ExpiresAt    *time.Time   `json:"expires_at,omitempty"`
	RevokedAt    *time.Time   `json:"revoked_at,omitempty"`
	ReplacedBy   string       `json:"replaced_by,omitempty"`
	Label        string       `json:"label,omitempty"`
}

// Public returns the display view.
func (c Credential) Public() PublicCredential {
	p := PublicCredential{
		ID: c.ID, PrincipalID: c.PrincipalID, Class: c.Class, ClientID: c.ClientID,
		Capabilities: slices.Clone(c.Capabilities), Scope: c.Scope, CreatedAt: c.CreatedAt,
		ReplacedBy: c.ReplacedBy, Label: c.Label,
	}
	if p.Capabilities == nil {
		p.Capabilities = []Capability{}
	}
	if !c.ExpiresAt.IsZero() {
		t := c.ExpiresAt
		p.ExpiresAt = &t
	}
	if !c.RevokedAt.IsZero() {
		t := c.RevokedAt
		p.RevokedAt = &t
	}
	return p
}

// String is a one-line redacted summary.
func (c Credential) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Credential{id=%s principal=%s class=%s client=%s capabilities=%s scope=%q created=%s",
		c.ID, c.PrincipalID, c.Class, c.ClientID, joinCaps(c.Capabilities), c.Scope.String(), fmtTime(c.CreatedAt))
	if !c.ExpiresAt.IsZero() {
		fmt.Fprintf(&b, " expires=%s", fmtTime(c.ExpiresAt))
	}
	if !c.RevokedAt.IsZero() {
		fmt.Fprintf(&b, " revoked=%s", fmtTime(c.RevokedAt))
	}
	b.WriteString("}")
	return b.String()
}

// Format writes String for every verb, so %v, %+v, %#v and %x never reach
// the salt or the verifier.
func (c Credential) Format(f fmt.State, _ rune) { io.WriteString(f, c.String()) }

// MarshalJSON writes the Public view.
func (c Credential) MarshalJSON() ([]byte, error) { return json.Marshal(c.Public()) }

// LogValue logs the Public view.
func (c Credential) LogValue() slog.Value { return slog.AnyValue(c.Public()) }

func joinCaps(cs []Capability) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ",")
}

// timeLayout is the stored time format: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

func fmtTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// canonicalTime is t in UTC truncated to milliseconds, the precision stored.
func canonicalTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Millisecond)
}

// record is the stored form, version 1. Field order is fixed, so encoding
// is deterministic and the strict decoder can compare bytes.
type record struct {
	RecordVersion int          `json:"record_version"`
	ID            string       `json:"credential_id"`
	PrincipalID   string       `json:"principal_id"`
	Class         Class        `json:"class"`
	ClientID      string       `json:"client_id"`
	Capabilities  []Capability `json:"capabilities"`
	Scope         Scope        `json:"scope"`
	CreatedAt     string       `json:"created_at"`
	ExpiresAt     string       `json:"expires_at,omitempty"`
	RevokedAt     string       `json:"revoked_at,omitempty"`
	ReplacedBy    string       `json:"replaced_by,omitempty"`
	Label         string       `json:"label,omitempty"`
	Salt          string       `json:"salt"`
	Verifier      string       `json:"verifier"`
	AuthorityMAC  string       `json:"authority_mac"`
}

// validate checks every invariant of a credential that may be stored.
func (c *Credential) validate() error {
	if !ValidCredentialID(c.ID) {
		return errors.New("auth: credential id is not a ULID")
	}
	if err := lease.CheckOpaqueID("principal_id", c.PrincipalID); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := lease.CheckOpaqueID("client_id", c.ClientID); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if !c.Class.Valid() {
		return errors.New("auth: unknown principal class")
	}
	if len(c.Capabilities) == 0 {
		return errors.New("auth: a credential needs at least one capability")
	}
	caps, err := CanonicalCapabilities(c.Capabilities)
	if err != nil {
		return err
	}
	if !slices.Equal(caps, c.Capabilities) {
		return errors.New("auth: capabilities are not canonical")
	}
	if c.Class == ClassActorComponent {
		if _, ok := c.Scope.ActorBinding(); !ok {
			return errors.New("auth: an actor_component credential needs exactly one explicit actor grant (actor:NAME) in its scope")
		}
	}
	if slices.Contains(c.Capabilities, CapForceRelease) && c.Class != ClassAdministrator {
		return errors.New("auth: targets:force-release is only granted to administrator credentials")
	}
	if c.CreatedAt.IsZero() || !c.CreatedAt.Equal(canonicalTime(c.CreatedAt)) || c.CreatedAt.Year() > 9999 {
		return errors.New("auth: created_at must be set, in milliseconds")
	}
	if !c.ExpiresAt.IsZero() && (!c.ExpiresAt.After(c.CreatedAt) || !c.ExpiresAt.Equal(canonicalTime(c.ExpiresAt)) || c.ExpiresAt.Year() > 9999) {
		return errors.New("auth: expires_at must be after created_at, in milliseconds")
	}
	if !c.RevokedAt.IsZero() && (!c.RevokedAt.Equal(canonicalTime(c.RevokedAt)) || c.RevokedAt.Year() > 9999 || c.RevokedAt.Year() < 1970) {
		return errors.New("auth: revoked_at must be in milliseconds")
	}
	if c.ReplacedBy != "" && (!ValidCredentialID(c.ReplacedBy) || c.RevokedAt.IsZero()) {
		return errors.New("auth: replaced_by needs a credential id and a revocation")
	}
	if err := checkLabel(c.Label); err != nil {
		return err
	}
	if len(c.salt) != SaltLen || len(c.verifier) != 32 || len(c.mac) != 32 {
		return errors.New("auth: credential has no verifier")
	}
	return nil
}

func checkLabel(l string) error {
	if len(l) > MaxLabelBytes {
		return fmt.Errorf("auth: label is longer than %d bytes", MaxLabelBytes)
	}
	if !utf8.ValidString(l) {
		return errors.New("auth: label must be valid UTF-8")
	}
	for _, r := range l {
		if unicode.IsControl(r) {
			return errors.New("auth: label must not contain control characters")
		}
	}
	return nil
}

// EncodeCredential validates c and returns its stored record: strict JSON,
// version 1, holding the salt, verifier and authority MAC (hex) but never a
// key or secret.
// Every Store implementation stores exactly these bytes.
func EncodeCredential(c Credential) ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := record{
		RecordVersion: RecordVersion, ID: c.ID, PrincipalID: c.PrincipalID, Class: c.Class,
		ClientID: c.ClientID, Capabilities: c.Capabilities, Scope: c.Scope,
		CreatedAt: fmtTime(c.CreatedAt), ReplacedBy: c.ReplacedBy, Label: c.Label,
		Salt: hex.EncodeToString(c.salt), Verifier: hex.EncodeToString(c.verifier),
		AuthorityMAC: hex.EncodeToString(c.mac),
	}
	if !c.ExpiresAt.IsZero() {
		r.ExpiresAt = fmtTime(c.ExpiresAt)
	}
	if !c.RevokedAt.IsZero() {
		r.RevokedAt = fmtTime(c.RevokedAt)
	}
	return json.Marshal(r)
}

// DecodeCredential is the strict decoder of a stored record: unknown
// fields, trailing data, duplicate or reordered keys, another version and any
// broken invariant give ErrCorrupt (without the record's content).
func DecodeCredential(b []byte) (Credential, error) {
	var r record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Credential{}, ErrCorrupt
	}
	if dec.More() {
		return Credential{}, ErrCorrupt
	}
	if _, err := dec.Token(); err != io.EOF {
		return Credential{}, ErrCorrupt
	}
	if r.RecordVersion != RecordVersion {
		return Credential{}, ErrCorrupt
	}
	c := Credential{
		ID: r.ID, PrincipalID: r.PrincipalID, Class: r.Class, ClientID: r.ClientID,
		Capabilities: r.Capabilities, Scope: r.Scope, ReplacedBy: r.ReplacedBy, Label: r.Label,
	}
	var err error
	if c.CreatedAt, err = parseTime(r.CreatedAt); err != nil || c.CreatedAt.IsZero() {
		return Credential{}, ErrCorrupt
	}
	if c.ExpiresAt, err = parseTime(r.ExpiresAt); err != nil {
		return Credential{}, ErrCorrupt
	}
	if c.RevokedAt, err = parseTime(r.RevokedAt); err != nil {
		return Credential{}, ErrCorrupt
	}
	if c.salt, err = hex.DecodeString(r.Salt); err != nil {
		return Credential{}, ErrCorrupt
	}
	if c.verifier, err = hex.DecodeString(r.Verifier); err != nil {
		return Credential{}, ErrCorrupt
	}
	if c.mac, err = hex.DecodeString(r.AuthorityMAC); err != nil {
		return Credential{}, ErrCorrupt
	}
	// The encoder is deterministic: a record is canonical only when it is
	// exactly what EncodeCredential writes for its decoded value. This also
	// rejects duplicate keys, keys matched case-insensitively, upper-case
	// hex and non-canonical scopes.
	again, err := EncodeCredential(c)
	if err != nil || !bytes.Equal(again, b) {
		return Credential{}, ErrCorrupt
	}
	return c, nil
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}
