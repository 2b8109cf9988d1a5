// Package fencetest holds a reference fenced writer for tests and examples.
package fencetest

import (
	"context"
	"sort"
	"sync"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// Doc is a document written through a MemorySink.
type Doc struct {
	ID   string
	Body string
}

// Stored is a document as the sink holds it: its body, the guard of the
// write that produced it and its revision (1 for the first write).
type Stored struct {
	ID    string
	Body  string
	Guard fence.Guard
	Rev   int
}

// Rejection is a refused write, kept for tests to inspect.
type Rejection struct {
	Doc   Doc
	Guard fence.Guard
	Err   error
}

// MemorySink is an in-memory fenced store of documents: the reference
// implementation of fence.Sink. Each write is checked and applied under one
// lock, so the check is atomic with the write, and is refused unless the
// guard was issued for exactly this write (document id and body digest) and
// fence.Admit(guard stored with the document, guard of the write) holds: a
// missing or incomplete fence, a guard for another write, a different lock
// key or a token lower than the stored one is rejected with
// commit_rejected. That is the rule CouchDB's validate_doc_update enforces
// per document.
//
// The zero value is not usable; call NewMemorySink.
type MemorySink struct {
	name string

	mu       sync.Mutex
	docs     map[string]Stored
	accepted []Stored
	rejected []Rejection
}

var _ fence.Sink[Doc] = (*MemorySink)(nil)

// NewMemorySink returns an empty sink named name (a canonical identifier).
func NewMemorySink(name string) *MemorySink {
	return &MemorySink{name: name, docs: map[string]Stored{}}
}

// Name returns the sink name authorization is scoped by.
func (s *MemorySink) Name() string { return s.name }

// Bind names the write of doc: its id and the SHA-256 of its body.
func (s *MemorySink) Bind(doc Doc) (fence.Binding, error) {
	if doc.ID == "" {
		return fence.Binding{}, lease.Invalid("id", "must not be empty")
	}
	return fence.Binding{Target: doc.ID, PayloadSHA256: lease.PayloadSHA256([]byte(doc.Body))}, nil
}

// Commit writes doc conditioned on g: g must have been issued for exactly
// this write (Guard.Authorizes) and pass fence.Admit against the stored
// document's guard.
func (s *MemorySink) Commit(ctx context.Context, g fence.Guard, doc Doc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.docs[doc.ID]
	var stored *fence.Guard
	if ok {
		stored = &cur.Guard
		if cur.Guard == g && cur.Body == doc.Body {
			return nil // the exact repeat of the write it holds: already done
		}
	}
	w, err := s.Bind(doc)
	if err == nil {
		err = g.Authorizes(w)
	}
	if err == nil {
		err = fence.Admit(stored, g)
	}
	if err != nil {
		s.rejected = append(s.rejected, Rejection{Doc: doc, Guard: g, Err: err})
		return err
	}
	next := Stored{ID: doc.ID, Body: doc.Body, Guard: g, Rev: cur.Rev + 1}
	s.docs[doc.ID] = next
	s.accepted = append(s.accepted, next)
	return nil
}

// Get returns the stored document id.
func (s *MemorySink) Get(id string) (Stored, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.docs[id]
	return d, ok
}

// Docs returns every stored document, by id.
func (s *MemorySink) Docs() []Stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Stored, 0, len(s.docs))
	for _, d := range s.docs {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Accepted returns every accepted write, in order.
func (s *MemorySink) Accepted() []Stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Stored(nil), s.accepted...)
}

// Rejected returns every refused write, in order.
func (s *MemorySink) Rejected() []Rejection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Rejection(nil), s.rejected...)
}
