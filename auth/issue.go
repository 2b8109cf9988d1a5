package auth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"
)

// MaxKeyTTL bounds the lifetime of an expiring key.
const MaxKeyTTL = 100 * 365 * 24 * time.Hour

// IssueRequest describes a new credential.
type IssueRequest struct {
	// PrincipalID is the principal the key authenticates (an opaque id,
	// lease.CheckOpaqueID rules).
	PrincipalID string
	Class       Class
	// Capabilities must be non-empty and on the closed list.
	Capabilities []Capability
	Scope        Scope
	// ClientID names the client; empty means the principal id.
	ClientID string
	// TTL is the key's lifetime; zero means it does not expire.
	TTL time.Duration
	// Label is an optional short note (at most MaxLabelBytes).
	Label string
	// Now is the issue time; zero means time.Now.
	Now time.Time
}

// Issue creates a credential from req, stores its verifier in store and
// returns the full API key. The key is returned only here: it is not stored
// and cannot be read back. An actor_component needs exactly one explicit
// actor grant; targets:force-release is only issued to administrators;
// unknown capabilities and classes are refused.
func Issue(ctx context.Context, store Store, pepper Pepper, req IssueRequest) (string, Credential, error) {
	key, c, err := newCredential(pepper, req)
	if err != nil {
		return "", Credential{}, err
	}
	if err := store.Create(ctx, c); err != nil {
		return "", Credential{}, err
	}
	return key, c, nil
}

// newCredential validates req and makes the credential and its key.
func newCredential(pepper Pepper, req IssueRequest) (string, Credential, error) {
	if !pepper.Valid() {
		return "", Credential{}, errors.New("auth: no pepper")
	}
	if !req.Class.Valid() {
		return "", Credential{}, fmt.Errorf("auth: unknown principal class %q", clip(string(req.Class)))
	}
	if len(req.Capabilities) == 0 {
		return "", Credential{}, errors.New("auth: a credential needs at least one capability")
	}
	caps, err := CanonicalCapabilities(req.Capabilities)
	if err != nil {
		return "", Credential{}, err
	}
	if req.TTL < 0 || req.TTL > MaxKeyTTL {
		return "", Credential{}, errors.New("auth: key TTL must be zero (no expiry) or positive and at most 100 years")
	}
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	now = canonicalTime(now)
	id, err := NewCredentialID(now)
	if err != nil {
		return "", Credential{}, err
	}
	secret, err := NewSecret()
	if err != nil {
		return "", Credential{}, err
	}
	salt := make([]byte, SaltLen)
	if _, err := io.ReadFull(rand.Reader, salt); err != nil {
		return "", Credential{}, errors.New("auth: no randomness for a salt")
	}
	c := Credential{
		ID: id, PrincipalID: req.PrincipalID, Class: req.Class, ClientID: req.ClientID,
		Capabilities: caps, Scope: req.Scope, CreatedAt: now, Label: req.Label,
		salt: salt, verifier: pepper.verifier(salt, &secret),
	}
	if c.ClientID == "" {
		c.ClientID = c.PrincipalID
	}
	if req.TTL > 0 {
		c.ExpiresAt = canonicalTime(now.Add(req.TTL))
		if !c.ExpiresAt.After(now) {
			c.ExpiresAt = now.Add(time.Millisecond)
		}
	}
	c.mac = pepper.authorityMAC(&c)
	if err := c.validate(); err != nil {
		return "", Credential{}, err
	}
	return FormatKey(id, secret), c, nil
}

// Rotate issues a new credential for the same principal, class, client,
// capabilities, scope and label as the credential id, and revokes id in
// the same atomic store operation. An expiring credential's successor gets
// the same lifetime from now. There is no grace period: the old key fails
// on its next request. A revoked credential cannot be rotated (ErrRevoked);
// an expired one can.
func Rotate(ctx context.Context, store Store, pepper Pepper, id string) (string, Credential, error) {
	if !ValidCredentialID(id) {
		return "", Credential{}, ErrNotFound
	}
	old, err := store.Get(ctx, id)
	if err != nil {
		return "", Credential{}, err
	}
	if !old.RevokedAt.IsZero() {
		return "", Credential{}, ErrRevoked
	}
	req := IssueRequest{
		PrincipalID: old.PrincipalID, Class: old.Class, Capabilities: old.Capabilities,
		Scope: old.Scope, ClientID: old.ClientID, Label: old.Label, Now: time.Now(),
	}
	if !old.ExpiresAt.IsZero() {
		req.TTL = old.ExpiresAt.Sub(old.CreatedAt)
	}
	key, next, err := newCredential(pepper, req)
	if err != nil {
		return "", Credential{}, err
	}
	if _, err := store.Rotate(ctx, id, req.Now, next); err != nil {
		return "", Credential{}, err
	}
	return key, next, nil
}

// Revoke revokes the credential id now; its key fails on its next request.
// Revoking a revoked credential is not an error. It returns the credential
// as stored afterwards.
func Revoke(ctx context.Context, store Store, id string) (Credential, error) {
	if !ValidCredentialID(id) {
		return Credential{}, ErrNotFound
	}
	return store.Revoke(ctx, id, time.Now())
}
