package audittest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/starintel/starlease/audit"
)

func TestFailingSinkCountsConcurrentCalls(t *testing.T) {
	s := &FailingSink{}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Write(context.Background(), audit.Event{}); !errors.Is(err, ErrSinkFailed) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if s.Calls() != 10 {
		t.Fatalf("calls %d", s.Calls())
	}
}
