package fencetest

import (
	"sync"

	"github.com/starintel/starlease/lease"
)

// LossRecorder records the codes a committer's loss handler saw
// (fence.WithLossHandler(r.Handler)). The zero value is ready; it is safe
// for concurrent use.
type LossRecorder struct {
	mu    sync.Mutex
	codes []lease.Code
}

// Handler is the loss handler to give the committer.
func (r *LossRecorder) Handler(err *lease.Error) {
	r.mu.Lock()
	r.codes = append(r.codes, err.Code)
	r.mu.Unlock()
}

// Seen returns the codes seen so far, in order.
func (r *LossRecorder) Seen() []lease.Code {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lease.Code(nil), r.codes...)
}
