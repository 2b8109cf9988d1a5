package auth

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Store errors. Implementations return these (possibly wrapped); any other
// failure is reported as ErrUnavailable, without backend detail.
var (
	// ErrNotFound: no credential has that id.
	ErrNotFound = errors.New("auth: credential not found")
	// ErrExists: a credential with that id already exists.
	ErrExists = errors.New("auth: credential already exists")
	// ErrRevoked: the credential is revoked and cannot be rotated.
	ErrRevoked = errors.New("auth: credential is revoked")
	// ErrUnavailable: the store cannot give a safe answer now.
	ErrUnavailable = errors.New("auth: credential store unavailable")
)

// DefaultListLimit and MaxListLimit bound Store.List pages.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Store is the credential store protocol. Records cross it as Credential
// values; implementations persist exactly the bytes of EncodeCredential and
// read them back with DecodeCredential (a record that does not decode is
// ErrCorrupt). Every method is atomic on its own, so several servers can
// share one store: a networked implementation (Valkey: one key per
// credential holding the record, SET NX for Create, a server-side script
// or WATCH/MULTI for Revoke and Rotate, a sorted-set index for List) needs
// nothing beyond these semantics. There is no cache in front of a Store:
// Get reads the current record every time.
type Store interface {
	// Create stores a new credential. ErrExists if its id is taken; an
	// invalid credential is refused before anything is written.
	Create(ctx context.Context, c Credential) error
	// Get returns the credential with id, or ErrNotFound.
	Get(ctx context.Context, id string) (Credential, error)
	// List returns up to limit credentials whose id sorts after the id
	// after ("" starts at the beginning), in id order (ULIDs: creation
	// order). limit <= 0 means DefaultListLimit; it is capped at
	// MaxListLimit.
	List(ctx context.Context, after string, limit int) ([]Credential, error)
	// Revoke marks the credential revoked at at. Revoking a revoked
	// credential changes nothing and is not an error. It returns the
	// stored credential after the call; ErrNotFound if there is none.
	Revoke(ctx context.Context, id string, at time.Time) (Credential, error)
	// Rotate atomically creates next and revokes oldID at at, recording
	// next.ID as its replacement. ErrNotFound if oldID does not exist,
	// ErrRevoked if it is already revoked, ErrExists if next.ID is taken.
	// It returns the revoked old credential.
	Rotate(ctx context.Context, oldID string, at time.Time, next Credential) (Credential, error)
	// Close releases the store.
	Close() error
}

// clampLimit applies the List bounds.
func clampLimit(limit int) int {
	switch {
	case limit <= 0:
		return DefaultListLimit
	case limit > MaxListLimit:
		return MaxListLimit
	}
	return limit
}

// revokedCopy returns c revoked at at (first revocation wins).
func revokedCopy(c Credential, at time.Time, replacedBy string) Credential {
	if c.RevokedAt.IsZero() {
		if at.IsZero() {
			at = time.Now()
		}
		c.RevokedAt = canonicalTime(at)
		c.ReplacedBy = replacedBy
	}
	return c
}

// MemoryStore is an in-memory Store for tests and single-process tools.
// It keeps encoded records, so it exercises the same codec as the durable
// stores. Safe for concurrent use.
type MemoryStore struct {
	mu      sync.Mutex
	records map[string][]byte
	closed  bool
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{records: map[string][]byte{}} }

var _ Store = (*MemoryStore)(nil)

func (m *MemoryStore) begin(ctx context.Context) error {
	if m.closed {
		return ErrUnavailable
	}
	if ctx.Err() != nil {
		return ErrUnavailable
	}
	return nil
}

// Create implements Store.
func (m *MemoryStore) Create(ctx context.Context, c Credential) error {
	b, err := EncodeCredential(c)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin(ctx); err != nil {
		return err
	}
	if _, ok := m.records[c.ID]; ok {
		return ErrExists
	}
	m.records[c.ID] = b
	return nil
}

func (m *MemoryStore) getLocked(id string) (Credential, error) {
	b, ok := m.records[id]
	if !ok {
		return Credential{}, ErrNotFound
	}
	return DecodeCredential(b)
}

// Get implements Store.
func (m *MemoryStore) Get(ctx context.Context, id string) (Credential, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin(ctx); err != nil {
		return Credential{}, err
	}
	return m.getLocked(id)
}

// List implements Store.
func (m *MemoryStore) List(ctx context.Context, after string, limit int) ([]Credential, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin(ctx); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(m.records))
	for id := range m.records {
		if strings.Compare(id, after) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	ids = ids[:min(len(ids), clampLimit(limit))]
	out := make([]Credential, 0, len(ids))
	for _, id := range ids {
		c, err := m.getLocked(id)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Revoke implements Store.
func (m *MemoryStore) Revoke(ctx context.Context, id string, at time.Time) (Credential, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin(ctx); err != nil {
		return Credential{}, err
	}
	c, err := m.getLocked(id)
	if err != nil {
		return Credential{}, err
	}
	if !c.RevokedAt.IsZero() {
		return c, nil
	}
	c = revokedCopy(c, at, "")
	b, err := EncodeCredential(c)
	if err != nil {
		return Credential{}, err
	}
	m.records[id] = b
	return c, nil
}

// Rotate implements Store.
func (m *MemoryStore) Rotate(ctx context.Context, oldID string, at time.Time, next Credential) (Credential, error) {
	nb, err := EncodeCredential(next)
	if err != nil {
		return Credential{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin(ctx); err != nil {
		return Credential{}, err
	}
	old, err := m.getLocked(oldID)
	if err != nil {
		return Credential{}, err
	}
	if !old.RevokedAt.IsZero() {
		return Credential{}, ErrRevoked
	}
	if _, ok := m.records[next.ID]; ok || next.ID == oldID {
		return Credential{}, ErrExists
	}
	old = revokedCopy(old, at, next.ID)
	ob, err := EncodeCredential(old)
	if err != nil {
		return Credential{}, err
	}
	m.records[oldID] = ob
	m.records[next.ID] = nb
	return old, nil
}

// Close implements Store; later calls fail with ErrUnavailable.
func (m *MemoryStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// rawRecord returns the stored bytes of id (tests).
func (m *MemoryStore) rawRecord(id string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.records[id])
}
