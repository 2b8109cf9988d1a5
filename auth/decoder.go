package auth

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
)

// DecodeStored strictly decodes the record a store holds under id
// (DecodeCredential) and checks that it is id's.
func DecodeStored(id string, raw []byte) (Credential, error) {
	c, err := DecodeCredential(raw)
	if err != nil {
		return Credential{}, err
	}
	if c.ID != id {
		return Credential{}, fmt.Errorf("%w: credential stored under another id", ErrCorrupt)
	}
	return c, nil
}

// Decodes is DecodeStored for a store's Get, which every request calls: it
// remembers, per id, the last record bytes it decoded and what they
// decoded to. It is not a credential cache: the store still reads the
// record at every request, and a decode is reused only for exactly the
// bytes it came from, so a revocation, rotation or expiry written to the
// record applies on the next request. The zero value is ready to use.
type Decodes struct {
	mu   sync.Mutex
	last map[string]decoded
}

type decoded struct {
	raw  []byte
	cred Credential
}

// maxDecodes bounds what Decodes holds: a record and its decode per id,
// about 1 KB for a typical key, at most about 33 KB for the largest record
// Issue writes (64 grants); past it, it starts again empty. Only records a
// store holds reach it: an unknown id is not found before any decode.
const maxDecodes = 4096

// Decode is DecodeStored(id, raw). Every caller gets a credential of its
// own (no slice shared with another caller or the memory).
func (d *Decodes) Decode(id string, raw []byte) (Credential, error) {
	d.mu.Lock()
	e, ok := d.last[id]
	d.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.cred.clone(), nil
	}
	c, err := DecodeStored(id, raw)
	if err != nil {
		return Credential{}, err // decoded afresh every time: nothing to gain
	}
	d.mu.Lock()
	if d.last == nil || len(d.last) >= maxDecodes {
		d.last = make(map[string]decoded)
	}
	d.last[id] = decoded{raw: bytes.Clone(raw), cred: c.clone()}
	d.mu.Unlock()
	return c, nil
}

// clone copies c's slices, so a copy shares no memory with c.
func (c Credential) clone() Credential {
	c.Capabilities = slices.Clone(c.Capabilities)
	for i := range c.Scope.grants {
		c.Scope.grants[i] = slices.Clone(c.Scope.grants[i])
	}
	c.salt, c.verifier, c.mac = bytes.Clone(c.salt), bytes.Clone(c.verifier), bytes.Clone(c.mac)
	return c
}
