package audit

import (
	"testing"
	"time"
)

func TestReadLimit(t *testing.T) {
	for limit, want := range map[int]int{-1: DefaultReadLimit, 0: DefaultReadLimit, 1: 1,
		MaxReadLimit: MaxReadLimit, MaxReadLimit + 1: MaxReadLimit} {
		if got := ReadLimit(limit); got != want {
			t.Errorf("ReadLimit(%d) = %d, want %d", limit, got, want)
		}
	}
}

// Matches looks at the event type, tenant, program and lease id, each only
// when set; Since and After are the sinks' to apply.
func TestFilterMatches(t *testing.T) {
	e := acquireEvent(t0)
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{EventType: EventAcquire, TenantID: "tenant-main", ProgramID: "program-a", LeaseID: "lease_01"}, true},
		{Filter{EventType: EventRevoke}, false},
		{Filter{TenantID: "tenant-two"}, false},
		{Filter{ProgramID: "program-b"}, false},
		{Filter{LeaseID: "lease_other"}, false},
		{Filter{Since: t0.Add(time.Hour), After: "~"}, true},
	} {
		if got := c.f.Matches(&e); got != c.want {
			t.Errorf("%+v: Matches = %v, want %v", c.f, got, c.want)
		}
	}
}
