package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/starintel/starlease/auth"
)

// CredentialsSection names the backup section that carries the API-key
// credentials of a backend whose credential store lives outside its lease
// namespace (bolt with a FileStore directory).
//
// The section is one auth.EncodeCredential record per line, in id order.
// A record holds a credential's salt, verifier and authority MAC (both
// HMAC-SHA-256 under the server's pepper), never a key or its secret; the
// pepper is not in the backup either, so restored keys verify only on a
// server given the same pepper file.
const CredentialsSection = "credentials"

// ErrCredentialTarget is returned when RestoreCredentials is given a store
// that already holds a credential: merging would mix two key sets.
var ErrCredentialTarget = errors.New("recovery: the credential store is not empty; restore credentials only into an empty store")

// BackupCredentials returns every credential in s (pages of List, in id
// order) as the CredentialsSection bytes, and how many there are. It is not
// a snapshot: a credential issued or revoked while it runs may or may not
// be in the result, so take it while no keys command runs.
func BackupCredentials(ctx context.Context, s auth.Store) ([]byte, int, error) {
	var buf bytes.Buffer
	n, after := 0, ""
	for {
		page, err := s.List(ctx, after, auth.MaxListLimit)
		if err != nil {
			return nil, 0, fmt.Errorf("recovery: cannot list credentials: %w", err)
		}
		if len(page) == 0 {
			return buf.Bytes(), n, nil
		}
		for _, c := range page {
			// Paging by "after" would silently skip credentials of a store
			// that breaks the id order, so that is an error.
			if c.ID <= after {
				return nil, 0, errors.New("recovery: the credential store listed credentials out of id order")
			}
			rec, err := auth.EncodeCredential(c)
			if err != nil {
				return nil, 0, fmt.Errorf("recovery: credential %s: %w", c.ID, err)
			}
			buf.Write(rec)
			buf.WriteByte('\n')
			after = c.ID
			n++
		}
	}
}

// RestoreCredentials creates every credential of a CredentialsSection in
// dst, exactly as recorded (a revoked credential stays revoked), and
// returns how many it created. The whole section is decoded strictly before
// anything is written: a malformed, repeated or out-of-order line is an
// error wrapping auth.ErrCorrupt and creates nothing. dst must be empty
// (ErrCredentialTarget). If a Create fails part way, the count says how
// many were created; empty the store before trying again.
func RestoreCredentials(ctx context.Context, dst auth.Store, data []byte) (int, error) {
	creds, err := decodeCredentials(data)
	if err != nil {
		return 0, err
	}
	existing, err := dst.List(ctx, "", 1)
	if err != nil {
		return 0, fmt.Errorf("recovery: cannot list the target credential store: %w", err)
	}
	if len(existing) != 0 {
		return 0, ErrCredentialTarget
	}
	for i, c := range creds {
		if err := dst.Create(ctx, c); err != nil {
			return i, fmt.Errorf("recovery: cannot restore credential %s: %w", c.ID, err)
		}
	}
	return len(creds), nil
}

// decodeCredentials parses a CredentialsSection. Errors name the line, not
// its content.
func decodeCredentials(data []byte) ([]auth.Credential, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if data[len(data)-1] != '\n' {
		return nil, fmt.Errorf("recovery: the credentials section does not end with a newline: %w", auth.ErrCorrupt)
	}
	lines := bytes.Split(data[:len(data)-1], []byte{'\n'})
	out := make([]auth.Credential, 0, len(lines))
	for i, line := range lines {
		c, err := auth.DecodeCredential(line)
		if err != nil {
			return nil, fmt.Errorf("recovery: credentials line %d: %w", i+1, err)
		}
		if i > 0 && c.ID <= out[i-1].ID {
			return nil, fmt.Errorf("recovery: credentials line %d is repeated or out of id order: %w", i+1, auth.ErrCorrupt)
		}
		out = append(out, c)
	}
	return out, nil
}
