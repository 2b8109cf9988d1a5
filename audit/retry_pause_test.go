package audit

import (
	"testing"
	"time"
)

// The pause after a failed Flush doubles with consecutive failures up to 64
// times RetryInterval, and is RetryInterval when a concurrent Flush has
// succeeded in between and reset the count (the loop once shifted by -1
// there and panicked, taking the process down).
func TestRetryPauseBackoffAndResetCount(t *testing.T) {
	s := &Indexed{opts: IndexedOptions{RetryInterval: time.Second}}
	for _, c := range []struct {
		failures int
		want     time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {7, 64 * time.Second}, {1000, 64 * time.Second}} {
		s.failures = c.failures
		if got := s.retryPause(); got != c.want {
			t.Errorf("after %d failures: pause %v, want %v", c.failures, got, c.want)
		}
	}
}
