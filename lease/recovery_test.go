package lease

import (
	"slices"
	"testing"
)

// A plan is checked whole before any backend applies it: a malformed lock
// key or a value past the token limit refuses it.
func TestRecoveryPlanCheck(t *testing.T) {
	key := KeyPrefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	if err := CheckLockKey(key); err != nil {
		t.Fatalf("test key: %v", err)
	}
	for name, c := range map[string]struct {
		plan RecoveryPlan
		want Code
	}{
		"empty":           {RecoveryPlan{}, ""},
		"at the limit":    {RecoveryPlan{Counters: map[string]uint64{key: MaxFencingToken}, Floor: MaxFencingToken}, ""},
		"malformed key":   {RecoveryPlan{Counters: map[string]uint64{"c/" + key: 1}}, CodeInvalidRequest},
		"counter too far": {RecoveryPlan{Counters: map[string]uint64{key: MaxFencingToken + 1}}, CodeCounterExhausted},
		"floor too far":   {RecoveryPlan{Floor: MaxFencingToken + 1}, CodeCounterExhausted},
	} {
		if got := CodeOf(c.plan.Check()); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}

// A live record is revoked now by the recovery principal with the plan's
// reason; an expired one is archived as expired at its own expiry.
func TestRecoveryEnding(t *testing.T) {
	plan := RecoveryPlan{Reason: "restored"}
	rec := &Record{LeaseID: "lease-1", State: StateActive, ExpiresAt: UnixMilli(msExpires)}
	before, after := UnixMilli(msExpires-1), UnixMilli(msExpires)
	var res RecoveryResult
	live := plan.Ending(rec, before)
	if live != (RecoveryEnding{State: StateRevoked, At: before, By: RecoveryPrincipal, Reason: "restored"}) {
		t.Fatalf("live: %+v", live)
	}
	res.Note(rec.LeaseID, live)
	expired := plan.Ending(rec, after)
	if expired != (RecoveryEnding{State: StateExpired, At: rec.ExpiresAt}) {
		t.Fatalf("expired: %+v", expired)
	}
	res.Note("lease-2", expired)
	if !slices.Equal(res.Revoked, []string{"lease-1"}) || !slices.Equal(res.Expired, []string{"lease-2"}) {
		t.Fatalf("result %+v", res)
	}
}
