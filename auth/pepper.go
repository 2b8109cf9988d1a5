package auth

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

const (
	// MinPepperBytes is the least key material a pepper file must hold.
	MinPepperBytes = 32
	// MaxPepperBytes bounds a pepper file; a larger file is refused.
	MaxPepperBytes = 4096
)

// Pepper is the server-side HMAC key of every verifier. It is never stored
// with the credentials. It formats as "[redacted]" under every fmt verb and
// in JSON. The zero Pepper is not usable.
type Pepper struct{ key []byte }

// NewPepper makes a pepper of at least MinPepperBytes bytes (copied).
func NewPepper(key []byte) (Pepper, error) {
	if len(key) < MinPepperBytes {
		return Pepper{}, fmt.Errorf("auth: a pepper needs at least %d bytes of key material", MinPepperBytes)
	}
	if len(key) > MaxPepperBytes {
		return Pepper{}, fmt.Errorf("auth: a pepper holds at most %d bytes", MaxPepperBytes)
	}
	return Pepper{key: append([]byte(nil), key...)}, nil
}

// Valid reports whether p holds key material.
func (p Pepper) Valid() bool { return len(p.key) >= MinPepperBytes }

// String returns "[redacted]".
func (Pepper) String() string { return redacted }

// Format writes "[redacted]" for every verb.
func (Pepper) Format(f fmt.State, _ rune) { io.WriteString(f, redacted) }

// MarshalJSON writes "[redacted]".
func (Pepper) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// verifier computes HMAC-SHA-256(pepper, salt ‖ secret).
func (p Pepper) verifier(salt []byte, secret *Secret) []byte {
	m := hmac.New(sha256.New, p.key)
	m.Write(salt)
	m.Write(secret[:])
	return m.Sum(nil)
}

// authorityMAC computes the credential's authority MAC (see Credential).
// Its input is a JSON array starting with a version tag, so it never
// collides with a verifier's 48-byte input.
func (p Pepper) authorityMAC(c *Credential) []byte {
	expires := ""
	if !c.ExpiresAt.IsZero() {
		expires = fmtTime(c.ExpiresAt)
	}
	b, _ := json.Marshal([]any{"starlease/credential-authority/v1", c.ID, c.PrincipalID, c.Class, c.ClientID,
		c.Capabilities, c.Scope.Grants(), fmtTime(c.CreatedAt), expires,
		hex.EncodeToString(c.salt), hex.EncodeToString(c.verifier)})
	m := hmac.New(sha256.New, p.key)
	m.Write(b)
	return m.Sum(nil)
}

// DeriveKey derives a 32-byte key for purpose (a fixed label such as
// "page-token/v1") from the pepper with HKDF-SHA-256. Every server sharing
// the pepper derives the same key, and no derived key reveals the pepper or
// another purpose's key. The key must be kept like the pepper: never
// logged, stored or returned.
func (p Pepper) DeriveKey(purpose string) ([]byte, error) {
	if !p.Valid() || purpose == "" {
		return nil, errors.New("auth: a derived key needs a pepper and a purpose")
	}
	return hkdf.Key(sha256.New, p.key, nil, "starlease/"+purpose, 32)
}

// LoadPepper reads the pepper file at path.
//
// Format: the key material is the file's bytes, used verbatim as the HMAC
// key, after removing one trailing "\n" or "\r\n"; no hex or base64 decoding
// is applied (a hex text file is simply its characters). It must be at least
// MinPepperBytes and at most MaxPepperBytes long. GeneratePepperFile writes
// 64 hex characters of 32 random bytes, the recommended form (as does
// `openssl rand -hex 32 > F; chmod 600 F`).
//
// The path must name an existing regular file (a symbolic link to one is
// followed) that grants no permission to group or others (mode 0600 or
// 0400): a file with any of the bits 0077 set is refused (ReadSecretFile's
// checks).
func LoadPepper(path string) (Pepper, error) {
	b, err := ReadSecretFile(path, "pepper file", MaxPepperBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Pepper{}, errors.New("auth: pepper file does not exist (create one with `openssl rand -hex 32` and mode 0600)")
	case err != nil:
		return Pepper{}, fmt.Errorf("auth: %w", err)
	case len(b) < MinPepperBytes:
		return Pepper{}, fmt.Errorf("auth: pepper file holds %d bytes of key material; at least %d are required", len(b), MinPepperBytes)
	}
	return Pepper{key: b}, nil
}

// GeneratePepperFile creates a new pepper file at path: 32 random bytes as
// 64 lower-case hex characters and a newline, mode 0600. It refuses to
// overwrite an existing file (or follow a link at path).
func GeneratePepperFile(path string) error {
	var raw [32]byte
	if _, err := io.ReadFull(rand.Reader, raw[:]); err != nil {
		return errors.New("auth: no randomness for a pepper")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errors.New("auth: pepper file already exists; refusing to overwrite it")
		}
		return fmt.Errorf("auth: cannot create the pepper file: %w", underlying(err))
	}
	text := make([]byte, 0, 65)
	text = hex.AppendEncode(text, raw[:])
	text = append(text, '\n')
	_, werr := f.Write(text)
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(path)
		return errors.New("auth: cannot write the pepper file")
	}
	return nil
}

// underlying strips the path from an *fs.PathError.
func underlying(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
