package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// ErrInvalidCredential is the one error of every authentication failure:
// no Authorization header, several, a malformed value or key, an unknown
// credential id, a wrong secret, a revoked or an expired credential. The
// HTTP layer answers it with 401 invalid_credential and nothing else.
var ErrInvalidCredential = errors.New("invalid_credential")

// Reason is the internal, non-secret reason of an authentication failure,
// for audit and throttling only: it must never reach the caller.
type Reason string

// Failure reasons.
const (
	ReasonNone        Reason = ""
	ReasonMissing     Reason = "missing_credential"   // no Authorization header
	ReasonMultiple    Reason = "multiple_credentials" // several header values
	ReasonMalformed   Reason = "malformed_credential" // not "Bearer <key>" or a malformed key
	ReasonUnknown     Reason = "unknown_credential"   // well-formed key, no such id
	ReasonSecret      Reason = "secret_mismatch"      // wrong secret (or another pepper)
	ReasonTampered    Reason = "record_tampered"      // right secret, authority MAC mismatch (store written without the pepper)
	ReasonRevoked     Reason = "credential_revoked"   // right secret, revoked
	ReasonExpired     Reason = "credential_expired"   // right secret, expired
	ReasonCorrupt     Reason = "corrupt_record"       // the stored record fails decoding
	ReasonUnavailable Reason = "store_unavailable"    // the store could not answer
)

// Failure describes a failed authentication for audit. CredentialID is the
// id part of a well-formed key (non-secret; the key's owner may not exist);
// it is empty when no well-formed key was presented.
type Failure struct {
	Reason       Reason
	CredentialID string
}

// Principal is the authenticated, non-secret security context of a request.
type Principal struct {
	// ID is the principal id (owner_principal_id of the leases it acquires).
	ID    string
	Class Class
	// ClientID is owner_client_id.
	ClientID string
	// CredentialID is the non-secret id of the key used (owner_credential_id).
	CredentialID string
	// Capabilities is canonical and closed.
	Capabilities []Capability
	Scope        Scope
}

// Has reports whether p holds capability c.
func (p Principal) Has(c Capability) bool { return slices.Contains(p.Capabilities, c) }

// ActorBinding returns the actor an actor_component is bound to.
func (p Principal) ActorBinding() (string, bool) {
	if p.Class != ClassActorComponent {
		return "", false
	}
	return p.Scope.ActorBinding()
}

// Caller converts p into the lease store's security context.
func (p Principal) Caller(correlationID string) lease.Caller {
	return lease.Caller{
		PrincipalID: p.ID, PrincipalClass: string(p.Class), ClientID: p.ClientID,
		CredentialID: p.CredentialID, CorrelationID: correlationID,
	}
}

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal NewContext stored in ctx.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Authenticator verifies API keys against a Store. It keeps no cache: every
// call reads the store. Safe for concurrent use.
type Authenticator struct {
	store  Store
	pepper Pepper
	now    func() time.Time
	// dummy credential verified on the unknown-id path, and its record,
	// decoded on that path so it costs what a found record costs: through
	// Decodes, as the stores decode what they find.
	dummy        Credential
	dummyRecord  []byte
	dummyDecodes Decodes
	// equal is the constant-time comparison; tests wrap it to count calls.
	equal func(a, b []byte) bool
}

// NewAuthenticator returns an Authenticator over store with pepper. now is
// the clock deciding expiry; nil means time.Now.
func NewAuthenticator(store Store, pepper Pepper, now func() time.Time) (*Authenticator, error) {
	if store == nil {
		return nil, errors.New("auth: no credential store")
	}
	if !pepper.Valid() {
		return nil, errors.New("auth: no pepper (the server refuses to start without one)")
	}
	if now == nil {
		now = time.Now
	}
	a := &Authenticator{store: store, pepper: pepper, now: now, equal: hmac.Equal}
	// The dummy has the shape of a real record; its random verifier and MAC
	// match no secret.
	a.dummy = Credential{ID: "00000000000000000000000000", PrincipalID: "prn_dummy", Class: ClassAPIClient,
		ClientID: "prn_dummy", Capabilities: []Capability{CapLease}, CreatedAt: canonicalTime(time.Now()),
		salt: make([]byte, SaltLen), verifier: make([]byte, 32), mac: make([]byte, 32)}
	for _, b := range [][]byte{a.dummy.salt, a.dummy.verifier, a.dummy.mac} {
		if _, err := io.ReadFull(rand.Reader, b); err != nil {
			return nil, errors.New("auth: no randomness")
		}
	}
	var err error
	if a.dummyRecord, err = EncodeCredential(a.dummy); err != nil {
		return nil, err
	}
	return a, nil
}

// Authenticate verifies the request's Authorization header values (every
// value, as http.Header.Values("Authorization") returns them). It returns
// the principal, or exactly ErrInvalidCredential for every credential
// failure. A store that cannot answer gives an error wrapping
// ErrUnavailable instead (the service answers 503, not 401).
func (a *Authenticator) Authenticate(ctx context.Context, authorization []string) (Principal, error) {
	p, _, err := a.AuthenticateDetail(ctx, authorization)
	return p, err
}

// AuthenticateDetail is Authenticate that also returns the internal
// failure reason for audit. The Failure never holds secret material.
func (a *Authenticator) AuthenticateDetail(ctx context.Context, authorization []string) (Principal, Failure, error) {
	id, secret, reason := parseAuthorization(authorization)
	if reason != ReasonNone {
		return Principal{}, Failure{Reason: reason}, ErrInvalidCredential
	}
	fail := Failure{CredentialID: id}
	c, err := a.store.Get(ctx, id)
	found := err == nil
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		// The store decoded nothing; decode the dummy record instead.
		a.dummyDecodes.Decode(a.dummy.ID, a.dummyRecord)
	case errors.Is(err, ErrCorrupt):
		fail.Reason = ReasonCorrupt
	default:
		fail.Reason = ReasonUnavailable
		return Principal{}, fail, ErrUnavailable
	}
	// One path for known and unknown ids: both HMACs are computed and
	// compared in constant time either way.
	subject := &a.dummy
	if found {
		subject = &c
	}
	secretOK := a.equal(a.pepper.verifier(subject.salt, &secret), subject.verifier)
	authorityOK := a.equal(a.pepper.authorityMAC(subject), subject.mac)
	status := c.Status(a.now())
	switch {
	case fail.Reason == ReasonCorrupt:
	case !found:
		fail.Reason = ReasonUnknown
	case !secretOK:
		fail.Reason = ReasonSecret
	case !authorityOK:
		fail.Reason = ReasonTampered
	case status == StatusRevoked:
		fail.Reason = ReasonRevoked
	case status == StatusExpired:
		fail.Reason = ReasonExpired
	case c.ID != id:
		fail.Reason = ReasonCorrupt
	default:
		return Principal{
			ID: c.PrincipalID, Class: c.Class, ClientID: c.ClientID, CredentialID: c.ID,
			Capabilities: slices.Clone(c.Capabilities), Scope: c.Scope,
		}, Failure{}, nil
	}
	return Principal{}, fail, ErrInvalidCredential
}

// parseAuthorization accepts exactly one header value "Bearer <key>": the
// scheme in any letter case, one space, then a key ParseKey accepts.
func parseAuthorization(values []string) (string, Secret, Reason) {
	switch len(values) {
	case 0:
		return "", Secret{}, ReasonMissing
	case 1:
	default:
		return "", Secret{}, ReasonMultiple
	}
	v := values[0]
	const scheme = "Bearer"
	if v == "" {
		return "", Secret{}, ReasonMissing
	}
	if len(v) != len(scheme)+1+KeyLen || !strings.EqualFold(v[:len(scheme)], scheme) || v[len(scheme)] != ' ' {
		return "", Secret{}, ReasonMalformed
	}
	id, secret, err := ParseKey(v[len(scheme)+1:])
	if err != nil {
		return "", Secret{}, ReasonMalformed
	}
	return id, secret, ReasonNone
}
