package service

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

// Page tokens the service hands out are sealed: the store's cursor is
// encrypted and authenticated with AES-256-GCM under a key only the servers
// hold, with the token's binding as associated data — what it pages (the
// canonical list filter, or the history identity's lock key) and who may
// continue it (principal id, class, capabilities and scope). A client can
// neither read a cursor nor make one, and a token used with another filter,
// by another principal or with another scope does not open: 400
// invalid_lease_request on page_token. A binding holds no credential id, so
// a rotated key with the same authority continues its predecessor's pages.
//
// A token is base64url(version ‖ r ‖ ciphertext ‖ tag) with 24 random bytes
// r. Each token has its own key, HMAC-SHA-256(K, r[:12]), and nonce r[12:]:
// K is shared by every server of a deployment for as long as its pepper
// lives, so it must never meet the 2^32-message bound of random 96-bit GCM
// nonces under one key.
//
// Every token has one length, pageTokenLen, whatever it pages and wherever:
// the plaintext is the cursor's length (two bytes, big-endian), the cursor
// and zero bytes up to pageTokenPlain. A store cursor's length may depend
// on more than the caller may see — bolt's history cursor is the decimal
// form of a sequence shared by every identity on the server, so its length
// grows with every lease that ever ended anywhere — and a token must not
// carry it. The version byte is associated data too, so a token cannot be
// opened as another version. (Version 1, an unpadded form, was never
// released; it does not open.)

const (
	pageTokenVersion = 2
	pageTokenRandom  = 24
	pageTokenKeyLen  = 32
	// pageTokenPlain is the padded plaintext's size: the longest store
	// cursor a token carries is pageTokenPlain-2 bytes (the stores' cursors
	// are base64url of a small JSON object holding at most a lease id,
	// under 400 bytes).
	pageTokenPlain = 512
	// pageTokenLen is the length of every token the service hands out.
	pageTokenLen = ((1+pageTokenRandom+pageTokenPlain+16)*4 + 2) / 3
)

// A token must stay within what every decoder accepts.
var _ [lease.MaxPageTokenBytes - pageTokenLen]struct{}

type pageSealer struct{ key []byte }

// newPageSealer seals under key; nil makes a random key, good for one
// process only (its tokens die with it and no other server opens them).
func newPageSealer(key []byte) (*pageSealer, error) {
	if key == nil {
		key = make([]byte, pageTokenKeyLen)
		if _, err := rand.Read(key); err != nil {
			return nil, errors.New("service: no randomness for a page token key")
		}
	}
	if len(key) < pageTokenKeyLen {
		return nil, errors.New("service: a page token key needs at least 32 bytes")
	}
	return &pageSealer{key: bytes.Clone(key)}, nil
}

func (ps *pageSealer) aead(r []byte) cipher.AEAD {
	m := hmac.New(sha256.New, ps.key)
	m.Write(r)
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key is always a valid AES key
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return g
}

// seal returns the client's token for the store cursor under binding b,
// pageTokenLen bytes long whatever the cursor. A cursor too long to pad is
// the store's fault: lease_backend_unavailable, never a token that leaks
// its length or exceeds lease.MaxPageTokenBytes.
func (ps *pageSealer) seal(b []byte, cursor string) (string, error) {
	if len(cursor) > pageTokenPlain-2 {
		return "", &lease.Error{Code: lease.CodeBackendUnavailable, Reason: "the store's page cursor is too long to seal"}
	}
	plain := make([]byte, pageTokenPlain)
	binary.BigEndian.PutUint16(plain, uint16(len(cursor)))
	copy(plain[2:], cursor)
	out := make([]byte, 1+pageTokenRandom, 1+pageTokenRandom+pageTokenPlain+16)
	out[0] = pageTokenVersion
	r := out[1:]
	rand.Read(r) // never fails (crypto/rand aborts the process instead)
	out = ps.aead(r[:12]).Seal(out, r[12:], plain, versioned(pageTokenVersion, b))
	return base64.RawURLEncoding.EncodeToString(out), nil
}

// open returns the store cursor of a token sealed under binding b; "" is
// the first page.
func (ps *pageSealer) open(b []byte, token string) (string, error) {
	if token == "" {
		return "", nil
	}
	if len(token) > lease.MaxPageTokenBytes {
		return "", lease.Invalid("page_token", "too long")
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < 1+pageTokenRandom+16 || raw[0] != pageTokenVersion {
		return "", lease.Invalid("page_token", "malformed")
	}
	r := raw[1 : 1+pageTokenRandom]
	plain, err := ps.aead(r[:12]).Open(nil, r[12:], raw[1+pageTokenRandom:], versioned(raw[0], b))
	if err != nil {
		return "", lease.Invalid("page_token", "does not belong to this listing and caller")
	}
	// Authentic, so well-formed unless this server's key sealed it wrong.
	if len(plain) != pageTokenPlain || int(binary.BigEndian.Uint16(plain)) > pageTokenPlain-2 {
		return "", lease.Invalid("page_token", "malformed")
	}
	cursor := plain[2 : 2+binary.BigEndian.Uint16(plain)]
	if len(cursor) == 0 {
		return "", lease.Invalid("page_token", "does not belong to this listing and caller")
	}
	return string(cursor), nil
}

// versioned is the associated data of a token of version v under binding b.
func versioned(v byte, b []byte) []byte {
	return append([]byte{v}, b...)
}

// pageBinding is what a token of kind ("list", "history") pages and who
// may continue it, as length-prefixed fields.
func pageBinding(p auth.Principal, kind string, filter ...string) []byte {
	var b []byte
	add := func(v string) {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	add("starlease page token v1")
	add(kind)
	for _, f := range filter {
		add(f)
	}
	caps := make([]string, len(p.Capabilities))
	for i, c := range p.Capabilities {
		caps[i] = string(c)
	}
	add(p.ID)
	add(string(p.Class))
	add(strings.Join(caps, ","))
	add(p.Scope.String())
	return b
}
