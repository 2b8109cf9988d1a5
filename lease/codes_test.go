package lease

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestCodesWireValues(t *testing.T) {
	want := map[Code]string{
		CodeAcquired:            "lease_acquired",
		CodeRenewed:             "lease_renewed",
		CodeReleased:            "lease_released",
		CodeInspected:           "lease_inspected",
		CodeListed:              "lease_listed",
		CodeForceReleased:       "lease_force_released",
		CodeRevoked:             "lease_revoked",
		CodeCommitAuthorized:    "commit_authorized",
		CodeHistory:             "lease_history",
		CodeConflict:            "lease_conflict",
		CodeLost:                "lease_lost",
		CodeIdempotencyConflict: "idempotency_conflict",
		CodeDeadlineExceeded:    "deadline_exceeded",
		CodeRateLimited:         "lease_rate_limited",
		CodeBackendUnavailable:  "lease_backend_unavailable",
		CodeOutcomeUnknown:      "lease_outcome_unknown",
		CodeInvalidRequest:      "invalid_lease_request",
		CodeNotFound:            "lease_not_found",
		CodeCorrupt:             "lease_corrupt",
		CodeCounterExhausted:    "lease_counter_exhausted",
		CodeCommitRejected:      "commit_rejected",
		CodeInvalidCredential:   "invalid_credential",
		CodeAccessDenied:        "access_denied",
	}
	for c, s := range want {
		if string(c) != s {
			t.Errorf("code %q, want wire value %q", c, s)
		}
	}
	all := Codes()
	if len(all) != len(want) {
		t.Fatalf("Codes() has %d codes, want %d: %v", len(all), len(want), all)
	}
	seen := map[Code]bool{}
	for _, c := range all {
		if seen[c] {
			t.Errorf("duplicate %q", c)
		}
		seen[c] = true
		if _, ok := want[c]; !ok {
			t.Errorf("unexpected code %q", c)
		}
	}
}

// The contract's HTTP table codes are all in the closed set.
func TestContractWireTableCodesAreKnown(t *testing.T) {
	for _, s := range []string{"lease_acquired", "lease_renewed", "lease_released", "lease_inspected", "lease_listed",
		"lease_revoked", "invalid_lease_request", "invalid_credential", "access_denied", "lease_conflict", "lease_lost",
		"idempotency_conflict", "deadline_exceeded", "lease_rate_limited", "lease_backend_unavailable",
		"lease_outcome_unknown", "lease_not_found"} {
		if !Code(s).Known() {
			t.Errorf("contract code %q is not Known", s)
		}
	}
}

func TestCodeProperties(t *testing.T) {
	success := []string{}
	retryable := []string{}
	for _, c := range Codes() {
		if !c.Known() {
			t.Errorf("%q not Known", c)
		}
		if c.Message() == "" || c.Message() == "Unknown result" {
			t.Errorf("%q has message %q", c, c.Message())
		}
		if c.Success() && c.Retryable() {
			t.Errorf("success code %q is retryable", c)
		}
		if c.Success() {
			success = append(success, string(c))
		}
		if c.Retryable() {
			retryable = append(retryable, string(c))
		}
		// Messages are static, non-secret text: no format verbs.
		if strings.Contains(c.Message(), "%") {
			t.Errorf("%q message %q has a format verb", c, c.Message())
		}
	}
	sort.Strings(success)
	sort.Strings(retryable)
	wantSuccess := "commit_authorized lease_acquired lease_force_released lease_history lease_inspected lease_listed lease_released lease_renewed lease_revoked"
	if got := strings.Join(success, " "); got != wantSuccess {
		t.Errorf("success codes = %s\nwant %s", got, wantSuccess)
	}
	wantRetry := "deadline_exceeded lease_backend_unavailable lease_conflict lease_outcome_unknown lease_rate_limited"
	if got := strings.Join(retryable, " "); got != wantRetry {
		t.Errorf("retryable codes = %s\nwant %s", got, wantRetry)
	}
	if CodeConflict.Message() != "Target lease is unavailable" {
		t.Errorf("conflict message = %q (the contract's example)", CodeConflict.Message())
	}
	unknown := Code("lease_granted")
	if unknown.Known() || unknown.Success() || unknown.Retryable() || unknown.Message() != "Unknown result" {
		t.Fatal("unknown code must be unknown, unsuccessful, not retryable")
	}
	if Code("").Known() {
		t.Fatal(`"" is Known`)
	}
}

func TestErrorString(t *testing.T) {
	cases := []struct {
		e    *Error
		want string
	}{
		{Invalid("lock_identity.target_id", "must not be empty"), "invalid_lease_request: lock_identity.target_id: must not be empty"},
		{Errorf(CodeConflict, "held until %d", 5), "lease_conflict: held until 5"},
		{&Error{Code: CodeLost}, "lease_lost"},
		{&Error{Code: CodeLost, Field: "f"}, "lease_lost"},
	}
	for _, tc := range cases {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	e := Invalid("f", "r")
	if e.Code != CodeInvalidRequest || e.Field != "f" || e.Reason != "r" {
		t.Fatalf("Invalid = %+v", e)
	}
	e = Errorf(CodeCorrupt, "x=%s", "y")
	if e.Code != CodeCorrupt || e.Field != "" || e.Reason != "x=y" {
		t.Fatalf("Errorf = %+v", e)
	}
}

func TestErrorIs(t *testing.T) {
	err := error(Invalid("ttl_ms", "must be positive"))
	if !errors.Is(err, &Error{Code: CodeInvalidRequest}) {
		t.Fatal("errors.Is on code")
	}
	if errors.Is(err, &Error{Code: CodeCorrupt}) {
		t.Fatal("errors.Is matched another code")
	}
	wrapped := fmt.Errorf("acquire: %w", err)
	if !errors.Is(wrapped, &Error{Code: CodeInvalidRequest}) {
		t.Fatal("errors.Is through wrapping")
	}
	// A target carrying Field or Reason is not a code-only pattern.
	if errors.Is(err, &Error{Code: CodeInvalidRequest, Field: "ttl_ms"}) {
		t.Fatal("errors.Is matched a target with a Field")
	}
	if errors.Is(err, &Error{Code: CodeInvalidRequest, Reason: "must be positive"}) {
		t.Fatal("errors.Is matched a target with a Reason")
	}
	if errors.Is(errors.New("invalid_lease_request"), &Error{Code: CodeInvalidRequest}) {
		t.Fatal("foreign error matched")
	}
	if errors.Is(err, errors.New("x")) {
		t.Fatal("matched a foreign target")
	}
	// RetryAfter/BackendTime do not affect matching.
	withHint := &Error{Code: CodeConflict, RetryAfter: 250 * time.Millisecond}
	if !errors.Is(withHint, &Error{Code: CodeConflict}) {
		t.Fatal("RetryAfter broke matching")
	}
}

func TestCodeOfAndAsError(t *testing.T) {
	if CodeOf(nil) != "" || AsError(nil) != nil {
		t.Fatal("nil error must map to nothing")
	}
	le := &Error{Code: CodeLost, Reason: "stale"}
	if CodeOf(le) != CodeLost || AsError(le) != le {
		t.Fatal("*Error passes through")
	}
	wrapped := fmt.Errorf("ctx: %w", le)
	if CodeOf(wrapped) != CodeLost || AsError(wrapped) != le {
		t.Fatal("wrapped *Error unwraps")
	}
	secret := errors.New("dial tcp 10.0.0.7:6379: AUTH failed for user admin password=hunter2")
	if got := CodeOf(secret); got != CodeBackendUnavailable {
		t.Fatalf("CodeOf(foreign) = %q", got)
	}
	got := AsError(secret)
	if got.Code != CodeBackendUnavailable || got.Field != "" || got.Reason != "backend error" {
		t.Fatalf("AsError(foreign) = %+v", got)
	}
	for _, leak := range []string{"10.0.0.7", "6379", "hunter2", "AUTH", "dial"} {
		if strings.Contains(got.Error(), leak) || strings.Contains(got.Reason, leak) {
			t.Fatalf("AsError leaks %q: %q", leak, got.Error())
		}
	}
	if got.Code.Success() {
		t.Fatal("foreign error reported as success")
	}
}
