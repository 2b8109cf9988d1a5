package lease

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"
)

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
var b64url43 = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

func rawContractIdentity() Identity {
	return Identity{TenantID: " Tenant-Main ", ProgramID: "PROGRAM-A", TargetNamespace: "starintel-target",
		TargetID: "Target_01", ActorName: "UserNameGen"}
}

func validAcquire() AcquireRequest {
	return AcquireRequest{
		Identity:          rawContractIdentity(),
		ServiceInstanceID: "instance_01",
		TTL:               30 * time.Second,
		MaximumLifetime:   5 * time.Minute,
		ExecutionID:       "execution_01",
		JobID:             "job_01",
		TraceID:           "trace_01",
		Metadata:          Metadata{"phase": "scan", "attempt": json.Number("1")},
		Mutation:          testMutation(),
	}
}

func validRenew() RenewRequest {
	return RenewRequest{Identity: rawContractIdentity(), LeaseID: "lease_01", FencingToken: 42,
		ServiceInstanceID: "instance_01", TTL: 30 * time.Second, Mutation: testMutation()}
}

func validRelease() ReleaseRequest {
	return ReleaseRequest{Identity: rawContractIdentity(), LeaseID: "lease_01", FencingToken: 42,
		ServiceInstanceID: "instance_01", Mutation: testMutation()}
}

func validAdmin() AdminRequest {
	m := testMutation()
	m.Caller.PrincipalID = "prn_admin_01"
	return AdminRequest{Identity: rawContractIdentity(), LeaseID: "lease_01", FencingToken: 42,
		Reason: "stuck worker on host 7", IncidentID: "inc_01", Mutation: m}
}

func validCommit() CommitRequest {
	return CommitRequest{Identity: rawContractIdentity(), LeaseID: "lease_01", FencingToken: 42,
		ServiceInstanceID: "instance_01", Sink: "CouchDB-Targets", CommitID: "commit_01",
		ExecutionID: "execution_01", JobID: "job_01", TraceID: "trace_01", Target: "doc:target_01",
		PayloadSHA256: digest64, DeadlineAt: fixedDeadline, Caller: testCaller()}
}

func checkPrepared(t *testing.T, p Prepared, op Op, principal, requestID string) {
	t.Helper()
	if p.Op != op || p.Identity != contractIdentity() || p.LockKey != goldenContractKey {
		t.Fatalf("prepared = %+v", p)
	}
	if want := IdempotencyScope(op, goldenContractKey, principal, requestID); p.Scope != want {
		t.Fatalf("scope = %q, want %q", p.Scope, want)
	}
	if !b64url43.MatchString(p.Scope) || !hex64.MatchString(p.Digest) {
		t.Fatalf("scope %q / digest %q have the wrong shape", p.Scope, p.Digest)
	}
}

func TestPrepareAcquireValid(t *testing.T) {
	req, p, err := PrepareAcquire(validAcquire(), StoreOptions{})
	if err != nil {
		t.Fatalf("PrepareAcquire: %v", err)
	}
	if req.Identity != contractIdentity() {
		t.Fatalf("request identity not normalized: %+v", req.Identity)
	}
	checkPrepared(t, p, OpAcquire, "prn_actor_01", "request_01")

	// Boundaries that are accepted.
	for name, mut := range map[string]func(*AcquireRequest){
		"ttl == maximum lifetime":    func(r *AcquireRequest) { r.TTL = r.MaximumLifetime },
		"ttl 1ms":                    func(r *AcquireRequest) { r.TTL = time.Millisecond },
		"ttl MaxTTL":                 func(r *AcquireRequest) { r.TTL, r.MaximumLifetime = MaxTTL, MaxLifetime },
		"max lifetime MaxLifetime":   func(r *AcquireRequest) { r.MaximumLifetime = MaxLifetime },
		"no trace id":                func(r *AcquireRequest) { r.TraceID = "" },
		"nil metadata":               func(r *AcquireRequest) { r.Metadata = nil },
		"deadline in the past":       func(r *AcquireRequest) { r.DeadlineAt = time.Unix(1, 0) },
		"no correlation or class":    func(r *AcquireRequest) { r.Caller.CorrelationID, r.Caller.PrincipalClass = "", "" },
		"configured operation class": func(r *AcquireRequest) { r.Identity.OperationClass = "Bulk" },
	} {
		r := validAcquire()
		mut(&r)
		classes, _ := NewOperationClasses("bulk")
		if _, _, err := PrepareAcquire(r, StoreOptions{OperationClasses: classes}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestPrepareAcquireRejects(t *testing.T) {
	cases := []struct {
		name          string
		mut           func(*AcquireRequest)
		field, reason string
	}{
		{"bad tenant", func(r *AcquireRequest) { r.Identity.TenantID = "a/b" }, "lock_identity.tenant_id", "must not contain path separators"},
		{"missing target", func(r *AcquireRequest) { r.Identity.TargetID = "" }, "lock_identity.target_id", "must not be empty"},
		{"unconfigured operation class", func(r *AcquireRequest) { r.Identity.OperationClass = "bulk" }, "lock_identity.operation_class", "not a configured operation class"},
		{"missing request_id", func(r *AcquireRequest) { r.RequestID = "" }, "request_id", "must not be empty"},
		{"request_id with space", func(r *AcquireRequest) { r.RequestID = "req 1" }, "request_id", ""},
		{"zero deadline", func(r *AcquireRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"missing principal", func(r *AcquireRequest) { r.Caller.PrincipalID = "" }, "owner_principal_id", "must not be empty"},
		{"missing client", func(r *AcquireRequest) { r.Caller.ClientID = "" }, "owner_client_id", "must not be empty"},
		{"missing credential", func(r *AcquireRequest) { r.Caller.CredentialID = "" }, "owner_credential_id", "must not be empty"},
		{"missing service instance", func(r *AcquireRequest) { r.ServiceInstanceID = "" }, "service_instance_id", "must not be empty"},
		{"missing execution", func(r *AcquireRequest) { r.ExecutionID = "" }, "execution_id", "must not be empty"},
		{"missing job", func(r *AcquireRequest) { r.JobID = "" }, "job_id", "must not be empty"},
		{"bad trace", func(r *AcquireRequest) { r.TraceID = "trace/01" }, "trace_id", ""},
		{"ttl 0", func(r *AcquireRequest) { r.TTL = 0 }, "ttl_ms", "must be positive"},
		{"ttl negative", func(r *AcquireRequest) { r.TTL = -time.Second }, "ttl_ms", "must be positive"},
		{"ttl sub-millisecond", func(r *AcquireRequest) { r.TTL = 500 * time.Microsecond }, "ttl_ms", "must be whole milliseconds"},
		{"ttl fractional millisecond", func(r *AcquireRequest) { r.TTL = 30*time.Second + time.Nanosecond }, "ttl_ms", "must be whole milliseconds"},
		{"ttl over MaxTTL", func(r *AcquireRequest) { r.TTL, r.MaximumLifetime = MaxTTL+time.Millisecond, MaxLifetime }, "ttl_ms", "exceeds the server maximum"},
		{"ttl over maximum lifetime", func(r *AcquireRequest) { r.TTL = 5*time.Minute + time.Millisecond }, "ttl_ms", "must not exceed maximum_lifetime_ms"},
		{"max lifetime 0", func(r *AcquireRequest) { r.MaximumLifetime = 0 }, "maximum_lifetime_ms", "must be positive"},
		{"max lifetime sub-ms", func(r *AcquireRequest) { r.MaximumLifetime = 5*time.Minute + time.Microsecond }, "maximum_lifetime_ms", "must be whole milliseconds"},
		{"max lifetime over MaxLifetime", func(r *AcquireRequest) { r.MaximumLifetime = MaxLifetime + time.Millisecond }, "maximum_lifetime_ms", "exceeds the server maximum"},
		{"metadata nested", func(r *AcquireRequest) { r.Metadata = Metadata{"k": map[string]any{}} }, "metadata.k", "values must be scalars"},
		{"metadata bad key", func(r *AcquireRequest) { r.Metadata = Metadata{"K": 1} }, "metadata", "keys must be canonical identifiers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validAcquire()
			tc.mut(&r)
			_, p, err := PrepareAcquire(r, StoreOptions{})
			if p != (Prepared{}) {
				t.Errorf("rejected request prepared %+v", p)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
}

// digestCase mutates a request and says what must change.
type digestCase[R any] struct {
	name                string
	mut                 func(*R)
	digestDiff, scopeDf bool
}

func runDigestCases[R any](t *testing.T, valid func() R, prep func(R) (Prepared, error), cases []digestCase[R]) {
	t.Helper()
	base, err := prep(valid())
	if err != nil {
		t.Fatalf("prepare base: %v", err)
	}
	again, _ := prep(valid())
	if again != base {
		t.Fatalf("identical requests prepare differently: %+v vs %+v", base, again)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := valid()
			tc.mut(&r)
			p, err := prep(r)
			if err != nil {
				t.Fatalf("prepare: %v", err)
			}
			if got := p.Digest != base.Digest; got != tc.digestDiff {
				t.Errorf("digest changed = %v, want %v", got, tc.digestDiff)
			}
			if got := p.Scope != base.Scope; got != tc.scopeDf {
				t.Errorf("scope changed = %v, want %v", got, tc.scopeDf)
			}
		})
	}
}

func TestAcquireDigestAndScope(t *testing.T) {
	prep := func(r AcquireRequest) (Prepared, error) {
		_, p, err := PrepareAcquire(r, StoreOptions{})
		return p, err
	}
	runDigestCases(t, validAcquire, prep, []digestCase[AcquireRequest]{
		{"ttl", func(r *AcquireRequest) { r.TTL = 31 * time.Second }, true, false},
		{"max lifetime", func(r *AcquireRequest) { r.MaximumLifetime = 6 * time.Minute }, true, false},
		{"service instance", func(r *AcquireRequest) { r.ServiceInstanceID = "instance_02" }, true, false},
		{"execution id", func(r *AcquireRequest) { r.ExecutionID = "execution_02" }, true, false},
		{"job id", func(r *AcquireRequest) { r.JobID = "job_02" }, true, false},
		{"trace id", func(r *AcquireRequest) { r.TraceID = "trace_02" }, true, false},
		{"trace id removed", func(r *AcquireRequest) { r.TraceID = "" }, true, false},
		{"metadata value", func(r *AcquireRequest) { r.Metadata["phase"] = "report" }, true, false},
		{"metadata number as written", func(r *AcquireRequest) { r.Metadata["attempt"] = json.Number("1.0") }, true, false},
		{"metadata key added", func(r *AcquireRequest) { r.Metadata["extra"] = nil }, true, false},
		{"metadata removed", func(r *AcquireRequest) { r.Metadata = nil }, true, false},
		{"client id", func(r *AcquireRequest) { r.Caller.ClientID = "client_02" }, true, false},
		{"credential id", func(r *AcquireRequest) { r.Caller.CredentialID = "key_02" }, true, false},
		{"request id", func(r *AcquireRequest) { r.RequestID = "request_02" }, false, true},
		{"principal", func(r *AcquireRequest) { r.Caller.PrincipalID = "prn_actor_02" }, true, true},
		{"identity", func(r *AcquireRequest) { r.Identity.TargetID = "target_02" }, true, true},
		{"deadline", func(r *AcquireRequest) { r.DeadlineAt = r.DeadlineAt.Add(time.Hour) }, false, false},
		{"correlation id", func(r *AcquireRequest) { r.Caller.CorrelationID = "corr_02" }, false, false},
		{"canonically equal identity", func(r *AcquireRequest) { r.Identity = contractIdentity() }, false, false},
		{"ttl as a different but equal duration", func(r *AcquireRequest) { r.TTL = 30000 * time.Millisecond }, false, false},
	})
	// nil and empty metadata are the same input.
	a, b := validAcquire(), validAcquire()
	a.Metadata, b.Metadata = nil, Metadata{}
	_, pa, _ := PrepareAcquire(a, StoreOptions{})
	_, pb, _ := PrepareAcquire(b, StoreOptions{})
	if pa.Digest != pb.Digest {
		t.Fatal("nil and empty metadata digest differently")
	}
}

func TestPrepareRenew(t *testing.T) {
	req, p, err := PrepareRenew(validRenew(), StoreOptions{})
	if err != nil {
		t.Fatalf("PrepareRenew: %v", err)
	}
	if req.Identity != contractIdentity() {
		t.Fatalf("identity not normalized: %+v", req.Identity)
	}
	checkPrepared(t, p, OpRenew, "prn_actor_01", "request_01")
	r := validRenew()
	r.TTL = 0 // keep the lease's current TTL
	if _, _, err := PrepareRenew(r, StoreOptions{}); err != nil {
		t.Fatalf("renew with TTL 0: %v", err)
	}
	r.FencingToken = MaxFencingToken
	if _, _, err := PrepareRenew(r, StoreOptions{}); err != nil {
		t.Fatalf("token 2^53-1: %v", err)
	}

	cases := []struct {
		name          string
		mut           func(*RenewRequest)
		field, reason string
	}{
		{"bad identity", func(r *RenewRequest) { r.Identity.ActorName = "a*" }, "lock_identity.actor_name", "must not contain pattern characters"},
		{"missing request_id", func(r *RenewRequest) { r.RequestID = "" }, "request_id", "must not be empty"},
		{"zero deadline", func(r *RenewRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"missing principal", func(r *RenewRequest) { r.Caller.PrincipalID = "" }, "owner_principal_id", "must not be empty"},
		{"missing lease id", func(r *RenewRequest) { r.LeaseID = "" }, "lease_id", "must not be empty"},
		{"token 0", func(r *RenewRequest) { r.FencingToken = 0 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"token 2^53", func(r *RenewRequest) { r.FencingToken = MaxFencingToken + 1 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"missing service instance", func(r *RenewRequest) { r.ServiceInstanceID = "" }, "service_instance_id", "must not be empty"},
		{"ttl negative", func(r *RenewRequest) { r.TTL = -time.Millisecond }, "ttl_ms", "must be positive"},
		{"ttl sub-millisecond", func(r *RenewRequest) { r.TTL = 999 * time.Microsecond }, "ttl_ms", "must be whole milliseconds"},
		{"ttl over MaxTTL", func(r *RenewRequest) { r.TTL = MaxTTL + time.Millisecond }, "ttl_ms", "exceeds the server maximum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validRenew()
			tc.mut(&r)
			_, p, err := PrepareRenew(r, StoreOptions{})
			if p != (Prepared{}) {
				t.Errorf("prepared %+v", p)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}

	prep := func(r RenewRequest) (Prepared, error) { _, p, err := PrepareRenew(r, StoreOptions{}); return p, err }
	runDigestCases(t, validRenew, prep, []digestCase[RenewRequest]{
		{"lease id", func(r *RenewRequest) { r.LeaseID = "lease_02" }, true, false},
		{"token", func(r *RenewRequest) { r.FencingToken = 43 }, true, false},
		{"service instance", func(r *RenewRequest) { r.ServiceInstanceID = "instance_02" }, true, false},
		{"ttl", func(r *RenewRequest) { r.TTL = 0 }, true, false},
		{"request id", func(r *RenewRequest) { r.RequestID = "request_02" }, false, true},
		{"principal", func(r *RenewRequest) { r.Caller.PrincipalID = "prn_actor_02" }, true, true},
		{"deadline", func(r *RenewRequest) { r.DeadlineAt = time.Unix(9, 0) }, false, false},
	})
}

func TestPrepareRelease(t *testing.T) {
	req, p, err := PrepareRelease(validRelease(), StoreOptions{})
	if err != nil {
		t.Fatalf("PrepareRelease: %v", err)
	}
	if req.Identity != contractIdentity() {
		t.Fatalf("identity not normalized: %+v", req.Identity)
	}
	checkPrepared(t, p, OpRelease, "prn_actor_01", "request_01")
	cases := []struct {
		name          string
		mut           func(*ReleaseRequest)
		field, reason string
	}{
		{"bad identity", func(r *ReleaseRequest) { r.Identity.ProgramID = ".." }, "lock_identity.program_id", "must start with a letter or digit"},
		{"missing request_id", func(r *ReleaseRequest) { r.RequestID = "" }, "request_id", "must not be empty"},
		{"zero deadline", func(r *ReleaseRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"bad lease id", func(r *ReleaseRequest) { r.LeaseID = "lease 01" }, "lease_id", ""},
		{"token 0", func(r *ReleaseRequest) { r.FencingToken = 0 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"missing service instance", func(r *ReleaseRequest) { r.ServiceInstanceID = "" }, "service_instance_id", "must not be empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validRelease()
			tc.mut(&r)
			_, _, err := PrepareRelease(r, StoreOptions{})
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
	prep := func(r ReleaseRequest) (Prepared, error) {
		_, p, err := PrepareRelease(r, StoreOptions{})
		return p, err
	}
	runDigestCases(t, validRelease, prep, []digestCase[ReleaseRequest]{
		{"lease id", func(r *ReleaseRequest) { r.LeaseID = "lease_02" }, true, false},
		{"token", func(r *ReleaseRequest) { r.FencingToken = 41 }, true, false},
		{"service instance", func(r *ReleaseRequest) { r.ServiceInstanceID = "instance_02" }, true, false},
		{"request id", func(r *ReleaseRequest) { r.RequestID = "request_02" }, false, true},
		{"principal", func(r *ReleaseRequest) { r.Caller.PrincipalID = "prn_actor_02" }, true, true},
		{"deadline", func(r *ReleaseRequest) { r.DeadlineAt = time.Unix(9, 0) }, false, false},
	})
}

// The same request id under different operations is a different scope.
func TestScopeSeparatesOperations(t *testing.T) {
	_, a, _ := PrepareAcquire(validAcquire(), StoreOptions{})
	_, rn, _ := PrepareRenew(validRenew(), StoreOptions{})
	_, rl, _ := PrepareRelease(validRelease(), StoreOptions{})
	adm := validAdmin()
	adm.Caller.PrincipalID = "prn_actor_01"
	_, fr, _ := PrepareAdmin(OpForceRelease, adm, StoreOptions{})
	_, rv, _ := PrepareAdmin(OpRevoke, adm, StoreOptions{})
	seen := map[string]Op{}
	for _, p := range []Prepared{a, rn, rl, fr, rv} {
		if prev, dup := seen[p.Scope]; dup {
			t.Fatalf("%s and %s share scope %q", prev, p.Op, p.Scope)
		}
		seen[p.Scope] = p.Op
	}
	if rn.Digest == rl.Digest {
		t.Fatal("renew and release digests coincide")
	}
	if fr.Digest == rv.Digest {
		t.Fatal("force-release and revoke digests coincide")
	}
}

func TestIdempotencyScope(t *testing.T) {
	s := IdempotencyScope(OpAcquire, goldenContractKey, "prn_actor_01", "request_01")
	if !b64url43.MatchString(s) {
		t.Fatalf("scope %q", s)
	}
	if IdempotencyScope(OpAcquire, goldenContractKey, "prn_actor_01", "request_01") != s {
		t.Fatal("not deterministic")
	}
	// Length prefixing: shifting bytes between components never collides.
	pairs := [][2][4]string{
		{{"acquire", "k", "ab", "c"}, {"acquire", "k", "a", "bc"}},
		{{"acquire", "kp", "", "r"}, {"acquire", "k", "p", "r"}},
		{{"acquire", "", "k", "r"}, {"acquire", "k", "", "r"}},
	}
	for _, p := range pairs {
		a := IdempotencyScope(Op(p[0][0]), p[0][1], p[0][2], p[0][3])
		b := IdempotencyScope(Op(p[1][0]), p[1][1], p[1][2], p[1][3])
		if a == b {
			t.Errorf("%v and %v collide", p[0], p[1])
		}
	}
}

func TestAdminOutcome(t *testing.T) {
	if c, st := AdminOutcome(OpForceRelease); c != CodeForceReleased || st != StateReleased {
		t.Fatalf("force_release: %s %s", c, st)
	}
	if c, st := AdminOutcome(OpRevoke); c != CodeRevoked || st != StateRevoked {
		t.Fatalf("revoke: %s %s", c, st)
	}
}

func TestPrepareAdmin(t *testing.T) {
	for _, op := range []Op{OpForceRelease, OpRevoke} {
		req, p, err := PrepareAdmin(op, validAdmin(), StoreOptions{})
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if req.Identity != contractIdentity() {
			t.Fatalf("identity not normalized: %+v", req.Identity)
		}
		checkPrepared(t, p, op, "prn_admin_01", "request_01")
	}
	for _, op := range []Op{OpAcquire, OpRenew, OpRelease, "", "delete"} {
		_, _, err := PrepareAdmin(op, validAdmin(), StoreOptions{})
		wantErr(t, err, CodeInvalidRequest, "operation", "not an administrative operation")
	}
	okCases := map[string]func(*AdminRequest){
		"reason only":      func(r *AdminRequest) { r.IncidentID = "" },
		"incident only":    func(r *AdminRequest) { r.Reason = "" },
		"reason 512 bytes": func(r *AdminRequest) { r.Reason = strings.Repeat("r", 512) },
		"unicode reason":   func(r *AdminRequest) { r.Reason = "Überlast – worker hängt" },
	}
	for name, mut := range okCases {
		r := validAdmin()
		mut(&r)
		if _, _, err := PrepareAdmin(OpRevoke, r, StoreOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	cases := []struct {
		name          string
		mut           func(*AdminRequest)
		field, reason string
	}{
		{"bad identity", func(r *AdminRequest) { r.Identity.TargetNamespace = "ns{x}" }, "lock_identity.target_namespace", "must not contain pattern characters"},
		{"missing request_id", func(r *AdminRequest) { r.RequestID = "" }, "request_id", "must not be empty"},
		{"zero deadline", func(r *AdminRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"missing principal", func(r *AdminRequest) { r.Caller.PrincipalID = "" }, "owner_principal_id", "must not be empty"},
		{"missing lease id", func(r *AdminRequest) { r.LeaseID = "" }, "lease_id", "must not be empty"},
		{"token 0", func(r *AdminRequest) { r.FencingToken = 0 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"token 2^53", func(r *AdminRequest) { r.FencingToken = 1 << 53 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"missing reason and incident", func(r *AdminRequest) { r.Reason, r.IncidentID = "", "" }, "reason", "a reason or incident_id is required"},
		{"reason with control char", func(r *AdminRequest) { r.Reason = "stuck\x07worker" }, "reason", "must not contain control or format characters"},
		{"reason with newline", func(r *AdminRequest) { r.Reason = "line1\nline2" }, "reason", "must not contain control or format characters"},
		{"reason with C1 control", func(r *AdminRequest) { r.Reason = "a\u0085b" }, "reason", "must not contain control or format characters"},
		{"reason 513 bytes", func(r *AdminRequest) { r.Reason = strings.Repeat("r", 513) }, "reason", "must be at most 512 bytes"},
		{"reason invalid utf8", func(r *AdminRequest) { r.Reason = "bad \xff" }, "reason", "must be valid UTF-8"},
		{"reason blank", func(r *AdminRequest) { r.Reason = "   " }, "reason", "must not be blank"},
		{"incident id invalid", func(r *AdminRequest) { r.IncidentID = "INC 42" }, "incident_id", ""},
		{"incident id only and invalid", func(r *AdminRequest) { r.Reason, r.IncidentID = "", "-1" }, "incident_id", ""},
		// Reason and incident id are stored in the record and returned by
		// history: credential material is refused, by the one rule.
		{"reason holds an API key", func(r *AdminRequest) {
			r.Reason = "leaked: star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32)
		}, "reason", ""},
		{"reason holds a bearer header", func(r *AdminRequest) { r.Reason = "sent Bearer abc" }, "reason", ""},
		{"reason holds 64 hex", func(r *AdminRequest) { r.Reason = "secret " + strings.Repeat("0f", 32) }, "reason", ""},
		{"incident id holds an API key", func(r *AdminRequest) {
			r.IncidentID = "star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32)
		}, "incident_id", ""},
		{"incident id holds 64 hex", func(r *AdminRequest) { r.IncidentID = "inc-" + strings.Repeat("0f", 32) }, "incident_id", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validAdmin()
			tc.mut(&r)
			_, p, err := PrepareAdmin(OpForceRelease, r, StoreOptions{})
			if p != (Prepared{}) {
				t.Errorf("prepared %+v", p)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
	prep := func(r AdminRequest) (Prepared, error) {
		_, p, err := PrepareAdmin(OpRevoke, r, StoreOptions{})
		return p, err
	}
	runDigestCases(t, validAdmin, prep, []digestCase[AdminRequest]{
		{"reason", func(r *AdminRequest) { r.Reason = "other reason" }, true, false},
		{"incident", func(r *AdminRequest) { r.IncidentID = "inc_02" }, true, false},
		{"lease id", func(r *AdminRequest) { r.LeaseID = "lease_02" }, true, false},
		{"token", func(r *AdminRequest) { r.FencingToken = 7 }, true, false},
		{"request id", func(r *AdminRequest) { r.RequestID = "request_02" }, false, true},
		{"principal", func(r *AdminRequest) { r.Caller.PrincipalID = "prn_admin_02" }, true, true},
		{"deadline", func(r *AdminRequest) { r.DeadlineAt = time.Unix(9, 0) }, false, false},
		// Reason "" + incident "ab" vs reason "a"... fields are length-prefixed.
		{"shift between reason and incident", func(r *AdminRequest) { r.Reason, r.IncidentID = "stuck worker on host 7i", "nc_01" }, true, false},
	})
}

func TestCheckReason(t *testing.T) {
	for _, ok := range []string{"", "x", strings.Repeat("é", 256), "tab-free reason: see INC-42"} {
		if err := CheckReason(ok); err != nil {
			t.Errorf("CheckReason(%q): %v", ok, err)
		}
	}
	wantErr(t, CheckReason(strings.Repeat("é", 256)+"x"), CodeInvalidRequest, "reason", "must be at most 512 bytes")
	wantErr(t, CheckReason("a\tb"), CodeInvalidRequest, "reason", "must not contain control or format characters")
	wantErr(t, CheckReason("\u00a0"), CodeInvalidRequest, "reason", "must not be blank")
}

func TestPrepareInspect(t *testing.T) {
	in := InspectRequest{Identity: rawContractIdentity(), DeadlineAt: fixedDeadline, Caller: testCaller()}
	req, key, err := PrepareInspect(in, StoreOptions{})
	if err != nil || key != goldenContractKey || req.Identity != contractIdentity() {
		t.Fatalf("by identity: %+v %q %v", req.Identity, key, err)
	}
	byID := InspectRequest{LeaseID: "lease_01", DeadlineAt: fixedDeadline}
	req, key, err = PrepareInspect(byID, StoreOptions{})
	if err != nil || key != "" || req.LeaseID != "lease_01" {
		t.Fatalf("by lease id: %+v %q %v", req, key, err)
	}
	cases := []struct {
		name          string
		req           InspectRequest
		field, reason string
	}{
		{"zero deadline", InspectRequest{LeaseID: "lease_01"}, "deadline_at", "a finite deadline is required"},
		{"both identity and lease id", InspectRequest{Identity: rawContractIdentity(), LeaseID: "lease_01", DeadlineAt: fixedDeadline}, "lease_id", "give either lock_identity or lease_id, not both"},
		{"neither", InspectRequest{DeadlineAt: fixedDeadline}, "lock_identity", "lock_identity or lease_id is required"},
		{"bad lease id", InspectRequest{LeaseID: "lease_01*", DeadlineAt: fixedDeadline}, "lease_id", ""},
		{"bad identity", InspectRequest{Identity: Identity{TenantID: "t"}, DeadlineAt: fixedDeadline}, "lock_identity.program_id", "must not be empty"},
		{"pattern identity", InspectRequest{Identity: Identity{TenantID: "*", ProgramID: "*", TargetNamespace: "*", TargetID: "*", ActorName: "*"}, DeadlineAt: fixedDeadline}, "lock_identity.tenant_id", "must not contain pattern characters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, key, err := PrepareInspect(tc.req, StoreOptions{})
			if key != "" {
				t.Errorf("key %q", key)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
}

func validListTarget() ListRequest {
	return ListRequest{By: ListByTarget, TenantID: "Tenant-Main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "TARGET_01", DeadlineAt: fixedDeadline, Caller: testCaller()}
}

func TestPrepareListFilters(t *testing.T) {
	pg, err := PrepareList(validListTarget(), StoreOptions{})
	if err != nil {
		t.Fatalf("by target: %v", err)
	}
	f, after, size := pg.Filter, pg.After, pg.Size
	wantTarget := "\x00\x0btenant-main\x00\x09program-a\x00\x10starintel-target\x00\x09target_01"
	if f.By != ListByTarget || f.Value != wantTarget || after != "" || size != DefaultMaxPageSize {
		t.Fatalf("by target = %+v %q %d", f, after, size)
	}
	if TargetIndexValue(contractIdentity()) != wantTarget {
		t.Fatal("TargetIndexValue differs from the list filter")
	}
	prog := ListRequest{By: ListByProgram, TenantID: "TENANT-MAIN", ProgramID: " program-a", DeadlineAt: fixedDeadline, PageSize: 7}
	pg, err = PrepareList(prog, StoreOptions{})
	f, size = pg.Filter, pg.Size
	if err != nil || f.By != ListByProgram || f.Value != "\x00\x0btenant-main\x00\x09program-a" || size != 7 {
		t.Fatalf("by program = %+v %d %v", f, size, err)
	}
	if ProgramIndexValue(contractIdentity()) != f.Value {
		t.Fatal("ProgramIndexValue differs from the list filter")
	}
	own := ListRequest{By: ListByOwner, OwnerPrincipalID: "prn_actor_01", DeadlineAt: fixedDeadline}
	pg, err = PrepareList(own, StoreOptions{})
	f = pg.Filter
	if err != nil || f.By != ListByOwner || f.Value != "\x00\x0cprn_actor_01" || OwnerIndexValue("prn_actor_01") != f.Value {
		t.Fatalf("by owner = %+v %v", f, err)
	}
	// Index values never collide across component boundaries.
	if TargetIndexValue(Identity{TenantID: "ab", ProgramID: "c", TargetNamespace: "n", TargetID: "t"}) ==
		TargetIndexValue(Identity{TenantID: "a", ProgramID: "bc", TargetNamespace: "n", TargetID: "t"}) {
		t.Fatal("target index values collide")
	}
	if ProgramIndexValue(Identity{TenantID: "ab", ProgramID: "c"}) == ProgramIndexValue(Identity{TenantID: "a", ProgramID: "bc"}) {
		t.Fatal("program index values collide")
	}
}

func TestPrepareListRejects(t *testing.T) {
	otherTok := EncodePageToken("lease_01", "program\x00"+ProgramIndexValue(contractIdentity()))
	cases := []struct {
		name          string
		mut           func(*ListRequest)
		field, reason string
	}{
		{"zero deadline", func(r *ListRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"no filter", func(r *ListRequest) { r.By = "" }, "by", "must be owner, target or program"},
		{"raw pattern filter", func(r *ListRequest) { r.By = "prefix" }, "by", "must be owner, target or program"},
		{"owner missing", func(r *ListRequest) { *r = ListRequest{By: ListByOwner, DeadlineAt: fixedDeadline} }, "owner_principal_id", "must not be empty"},
		{"owner with target fields", func(r *ListRequest) { r.By, r.OwnerPrincipalID = ListByOwner, "prn_actor_01" }, "owner_principal_id", "list by owner takes no target fields"},
		{"target with owner", func(r *ListRequest) { r.OwnerPrincipalID = "prn_actor_01" }, "owner_principal_id", "list by target or program takes no owner"},
		{"program with target fields", func(r *ListRequest) { r.By = ListByProgram }, "target_id", "list by program takes no target fields"},
		{"target missing target id", func(r *ListRequest) { r.TargetID = "" }, "target_id", "must not be empty"},
		{"target with pattern", func(r *ListRequest) { r.TargetID = "target_*" }, "target_id", "must not contain pattern characters"},
		{"program missing tenant", func(r *ListRequest) {
			*r = ListRequest{By: ListByProgram, ProgramID: "program-a", DeadlineAt: fixedDeadline}
		}, "tenant_id", "must not be empty"},
		{"negative page size", func(r *ListRequest) { r.PageSize = -1 }, "page_size", "must be between 1 and 100"},
		{"page size over max", func(r *ListRequest) { r.PageSize = 101 }, "page_size", "must be between 1 and 100"},
		{"page token from another filter", func(r *ListRequest) { r.PageToken = otherTok }, "page_token", "does not belong to this filter"},
		{"garbage page token", func(r *ListRequest) { r.PageToken = "not a token" }, "page_token", "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validListTarget()
			tc.mut(&r)
			_, err := PrepareList(r, StoreOptions{})
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
	// A configured maximum page size.
	r := validListTarget()
	r.PageSize = 11
	_, err := PrepareList(r, StoreOptions{MaxPageSize: 10})
	wantErr(t, err, CodeInvalidRequest, "page_size", "must be between 1 and 10")
	r.PageSize = 0
	if pg, err := PrepareList(r, StoreOptions{MaxPageSize: 10}); err != nil || pg.Size != 10 {
		t.Fatalf("default page size = %d, %v", pg.Size, err)
	}
	r.PageSize = 10
	if pg, err := PrepareList(r, StoreOptions{MaxPageSize: 10}); err != nil || pg.Size != 10 {
		t.Fatalf("max page size = %d, %v", pg.Size, err)
	}
}

func TestPrepareListPageTokenRoundTrip(t *testing.T) {
	pg, err := PrepareList(validListTarget(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := pg.Filter
	r := validListTarget()
	r.PageToken = EncodePageToken("lease_01ABC", string(f.By)+"\x00"+f.Value)
	r.TenantID = "TENANT-MAIN" // a canonically equal filter accepts the token
	pg, err = PrepareList(r, StoreOptions{})
	if err != nil || pg.After != "lease_01ABC" {
		t.Fatalf("after = %q, %v", pg.After, err)
	}
	// The same token on another target is refused.
	r.TargetID = "target_02"
	_, err = PrepareList(r, StoreOptions{})
	wantErr(t, err, CodeInvalidRequest, "page_token", "does not belong to this filter")
	// ... and on a by-program list of the same tenant/program.
	prog := ListRequest{By: ListByProgram, TenantID: "tenant-main", ProgramID: "program-a", DeadlineAt: fixedDeadline, PageToken: r.PageToken}
	_, err = PrepareList(prog, StoreOptions{})
	wantErr(t, err, CodeInvalidRequest, "page_token", "does not belong to this filter")
}

func TestPrepareHistory(t *testing.T) {
	in := HistoryRequest{Identity: rawContractIdentity(), DeadlineAt: fixedDeadline, Caller: testCaller()}
	pg, err := PrepareHistory(in, StoreOptions{})
	if err != nil || pg.LockKey != goldenContractKey || pg.After != "" || pg.Size != DefaultMaxPageSize || pg.Identity != contractIdentity() {
		t.Fatalf("PrepareHistory = %+v %q %q %d %v", pg.Identity, pg.LockKey, pg.After, pg.Size, err)
	}
	in.PageToken = EncodePageToken("h_0005", "history\x00"+goldenContractKey)
	in.PageSize = 3
	pg, err = PrepareHistory(in, StoreOptions{})
	if err != nil || pg.After != "h_0005" || pg.Size != 3 {
		t.Fatalf("with token: %q %d %v", pg.After, pg.Size, err)
	}
	cases := []struct {
		name          string
		mut           func(*HistoryRequest)
		field, reason string
	}{
		{"zero deadline", func(r *HistoryRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"bad identity", func(r *HistoryRequest) { r.Identity.TargetID = "a\\b" }, "lock_identity.target_id", "must not contain path separators"},
		{"page size over max", func(r *HistoryRequest) { r.PageSize = 101 }, "page_size", "must be between 1 and 100"},
		{"page token of another identity", func(r *HistoryRequest) {
			r.PageToken = EncodePageToken("h_0005", "history\x00"+KeyPrefix+"other")
		}, "page_token", "does not belong to this filter"},
		{"list token used for history", func(r *HistoryRequest) {
			r.PageToken = EncodePageToken("h_0005", "target\x00"+TargetIndexValue(contractIdentity()))
		}, "page_token", "does not belong to this filter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := HistoryRequest{Identity: rawContractIdentity(), DeadlineAt: fixedDeadline}
			tc.mut(&r)
			_, err := PrepareHistory(r, StoreOptions{})
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
}

func TestPrepareCommit(t *testing.T) {
	req, pc, err := PrepareCommit(validCommit(), StoreOptions{})
	if err != nil {
		t.Fatalf("PrepareCommit: %v", err)
	}
	if req.Identity != contractIdentity() || req.Sink != "couchdb-targets" || pc.LockKey != goldenContractKey || pc.Identity != contractIdentity() {
		t.Fatalf("PrepareCommit = %+v %+v", req, pc)
	}
	if !b64url43.MatchString(pc.Scope) || !hex64.MatchString(pc.Digest) {
		t.Fatalf("scope %q digest %q", pc.Scope, pc.Digest)
	}
	noTrace := validCommit()
	noTrace.TraceID = ""
	if _, _, err := PrepareCommit(noTrace, StoreOptions{}); err != nil {
		t.Fatalf("no trace: %v", err)
	}
	cases := []struct {
		name          string
		mut           func(*CommitRequest)
		field, reason string
	}{
		{"bad identity", func(r *CommitRequest) { r.Identity.TenantID = "" }, "lock_identity.tenant_id", "must not be empty"},
		{"zero deadline", func(r *CommitRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"missing principal", func(r *CommitRequest) { r.Caller.PrincipalID = "" }, "owner_principal_id", "must not be empty"},
		{"missing lease id", func(r *CommitRequest) { r.LeaseID = "" }, "lease_id", "must not be empty"},
		{"token 0", func(r *CommitRequest) { r.FencingToken = 0 }, "fencing_token", "must be between 1 and 2^53-1"},
		{"missing instance", func(r *CommitRequest) { r.ServiceInstanceID = "" }, "service_instance_id", "must not be empty"},
		{"missing sink", func(r *CommitRequest) { r.Sink = "" }, "sink", "must not be empty"},
		{"sink with path", func(r *CommitRequest) { r.Sink = "couchdb/targets" }, "sink", "must not contain path separators"},
		{"missing commit id", func(r *CommitRequest) { r.CommitID = "" }, "commit_id", "must not be empty"},
		{"missing execution id", func(r *CommitRequest) { r.ExecutionID = "" }, "execution_id", "must not be empty"},
		{"bad trace", func(r *CommitRequest) { r.TraceID = "t?" }, "trace_id", ""},
		{"missing job id", func(r *CommitRequest) { r.JobID = "" }, "job_id", "must not be empty"},
		{"missing target", func(r *CommitRequest) { r.Target = "" }, "target", "the write this commit is for is required"},
		{"target with a control character", func(r *CommitRequest) { r.Target = "doc\nx" }, "target", "must not contain control or format characters"},
		{"target too long", func(r *CommitRequest) { r.Target = strings.Repeat("d", MaxCommitTargetBytes+1) }, "target", "must be at most 2048 bytes"},
		{"target not UTF-8", func(r *CommitRequest) { r.Target = "doc\xff" }, "target", "must be valid UTF-8"},
		{"payload digest upper case", func(r *CommitRequest) { r.PayloadSHA256 = strings.ToUpper(digest64) }, "payload_sha256", "must be 64 lower-case hex digits"},
		{"payload digest short", func(r *CommitRequest) { r.PayloadSHA256 = "ab" }, "payload_sha256", "must be 64 lower-case hex digits"},
		{"publication with a target", func(r *CommitRequest) {
			r.Outbox = &OutboxMessage{RoutingKey: "rk", Body: []byte("{}")}
		}, "target", "a publication is its own target: give target and payload_sha256 only without outbox"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validCommit()
			tc.mut(&r)
			_, pc, err := PrepareCommit(r, StoreOptions{})
			if pc != (PreparedCommit{}) {
				t.Errorf("prepared %+v", pc)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
	prep := func(r CommitRequest) (Prepared, error) {
		_, pc, err := PrepareCommit(r, StoreOptions{})
		return Prepared{Scope: pc.Scope, Digest: pc.Digest}, err
	}
	runDigestCases(t, validCommit, prep, []digestCase[CommitRequest]{
		{"lease id", func(r *CommitRequest) { r.LeaseID = "lease_02" }, true, false},
		{"token", func(r *CommitRequest) { r.FencingToken = 41 }, true, false},
		{"instance", func(r *CommitRequest) { r.ServiceInstanceID = "instance_02" }, true, false},
		{"execution", func(r *CommitRequest) { r.ExecutionID = "execution_02" }, true, false},
		{"job", func(r *CommitRequest) { r.JobID = "job_02" }, true, false},
		{"target", func(r *CommitRequest) { r.Target = "doc:target_02" }, true, false},
		{"payload", func(r *CommitRequest) { r.PayloadSHA256 = strings.Repeat("b", 64) }, true, false},
		{"no payload digest", func(r *CommitRequest) { r.PayloadSHA256 = "" }, true, false},
		{"trace", func(r *CommitRequest) { r.TraceID = "trace_02" }, true, false},
		{"principal", func(r *CommitRequest) { r.Caller.PrincipalID = "prn_actor_02" }, true, false},
		{"sink", func(r *CommitRequest) { r.Sink = "rabbit" }, true, true},
		{"sink case", func(r *CommitRequest) { r.Sink = "COUCHDB-TARGETS" }, false, false},
		{"commit id", func(r *CommitRequest) { r.CommitID = "commit_02" }, true, true},
		{"identity", func(r *CommitRequest) { r.Identity.TargetID = "t2" }, true, true},
		{"deadline", func(r *CommitRequest) { r.DeadlineAt = time.Unix(9, 0) }, false, false},
	})
}

func TestPrepareLookup(t *testing.T) {
	in := LookupRequest{Op: OpAcquire, Identity: rawContractIdentity(), PrincipalID: "prn_actor_01", RequestID: "request_01", DeadlineAt: fixedDeadline}
	p, err := PrepareLookup(in, StoreOptions{})
	if err != nil {
		t.Fatalf("PrepareLookup: %v", err)
	}
	_, acq, _ := PrepareAcquire(validAcquire(), StoreOptions{})
	if p.Op != OpAcquire || p.Identity != contractIdentity() || p.LockKey != goldenContractKey || p.Scope != acq.Scope || p.Digest != "" {
		t.Fatalf("lookup %+v does not resolve acquire scope %q", p, acq.Scope)
	}
	cases := []struct {
		name          string
		mut           func(*LookupRequest)
		field, reason string
	}{
		{"unknown op", func(r *LookupRequest) { r.Op = "commit" }, "operation", "unknown operation"},
		{"empty op", func(r *LookupRequest) { r.Op = "" }, "operation", "unknown operation"},
		{"zero deadline", func(r *LookupRequest) { r.DeadlineAt = time.Time{} }, "deadline_at", "a finite deadline is required"},
		{"bad identity", func(r *LookupRequest) { r.Identity.ActorName = "a]" }, "lock_identity.actor_name", "must not contain pattern characters"},
		{"missing principal", func(r *LookupRequest) { r.PrincipalID = "" }, "owner_principal_id", "must not be empty"},
		{"missing request id", func(r *LookupRequest) { r.RequestID = "" }, "request_id", "must not be empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := in
			tc.mut(&r)
			p, err := PrepareLookup(r, StoreOptions{})
			if p != (Prepared{}) {
				t.Errorf("prepared %+v", p)
			}
			wantErr(t, err, CodeInvalidRequest, tc.field, tc.reason)
		})
	}
}

func TestStoreOptionsWithDefaults(t *testing.T) {
	o := StoreOptions{}.WithDefaults()
	if o.MaxPageSize != 100 || o.HistoryPerIdentity != 64 || o.HistoryRetention != 30*24*time.Hour ||
		o.IdempotencyRetention != MaxLifetime+24*time.Hour || o.CommitRetention != MaxLifetime+24*time.Hour || o.Logger == nil {
		t.Fatalf("defaults = %+v", o)
	}
	if !o.OperationClasses.Contains("default") || o.OperationClasses.Contains("fast") {
		t.Fatal("default operation classes")
	}
	classes, _ := NewOperationClasses("fast")
	c := StoreOptions{OperationClasses: classes, MaxPageSize: 5, HistoryPerIdentity: 2, HistoryRetention: time.Hour,
		IdempotencyRetention: MaxLifetime + time.Minute, CommitRetention: MaxLifetime + 2*time.Minute}.WithDefaults()
	if c.MaxPageSize != 5 || c.HistoryPerIdentity != 2 || c.HistoryRetention != time.Hour ||
		c.IdempotencyRetention != MaxLifetime+time.Minute || c.CommitRetention != MaxLifetime+2*time.Minute || !c.OperationClasses.Contains("fast") {
		t.Fatalf("explicit options overridden: %+v", c)
	}
	// Idempotency evidence must outlive the maximum lease lifetime.
	short := StoreOptions{IdempotencyRetention: MaxLifetime, CommitRetention: time.Hour}.WithDefaults()
	if short.IdempotencyRetention != DefaultIdempotencyRetention || short.CommitRetention != DefaultCommitRetention {
		t.Fatalf("too-short retention kept: %+v", short)
	}
}

func TestOpValid(t *testing.T) {
	for _, o := range []Op{OpAcquire, OpRenew, OpRelease, OpForceRelease, OpRevoke} {
		if !o.Valid() {
			t.Errorf("%q invalid", o)
		}
	}
	if string(OpForceRelease) != "force_release" || Op("inspect").Valid() || Op("").Valid() {
		t.Fatal("Op set")
	}
}

// The commit digest is stored with every idempotency record: a change to
// its encoding would turn the replay of an existing commit into
// idempotency_conflict. These values were computed by the code as it was
// before outbox headers existed; a header-less commit must keep them.
func TestCommitDigestPinned(t *testing.T) {
	outbox := validCommit()
	outbox.Sink = "rabbitmq"
	outbox.Target, outbox.PayloadSHA256 = "", ""
	outbox.Outbox = &OutboxMessage{Exchange: "starintel.results", RoutingKey: "target.result",
		ContentType: "application/json", Body: []byte(`{"open_ports":[22,443]}`)}
	minimal := outbox
	minimal.Outbox = &OutboxMessage{RoutingKey: "q"}
	for _, tc := range []struct {
		name          string
		req           CommitRequest
		scope, digest string
	}{
		{"outbox", outbox, "Hccli-58a65cJYfyQ1iBBV-NgtzPppdBko5ULoIzhLc", "91df0918334b5b427ae1d8fe162a777f73be1fbded3e6b1bb244c502c6293815"},
		{"minimal outbox", minimal, "Hccli-58a65cJYfyQ1iBBV-NgtzPppdBko5ULoIzhLc", "551e9ac27b836c54674e34b19d90573ca968e0399728d6f6978f3a49578ac008"},
		{"no outbox", validCommit(), "tgc9GdQitxHUBl-5btD2jo2N4UvDk646QdkU7qCp-NA", "068718c9d69ae6946a20fb3dbef0648564314d9602d59a97ed804802c7812f8a"},
		// Empty headers are no headers: the digest is the header-less one.
		{"outbox with empty headers", withHeaders(outbox, map[string]string{}), "Hccli-58a65cJYfyQ1iBBV-NgtzPppdBko5ULoIzhLc", "91df0918334b5b427ae1d8fe162a777f73be1fbded3e6b1bb244c502c6293815"},
	} {
		_, pc, err := PrepareCommit(tc.req, StoreOptions{})
		if err != nil || pc.Scope != tc.scope || pc.Digest != tc.digest {
			t.Errorf("%s: scope %s digest %s (%v), want the stored %s %s", tc.name, pc.Scope, pc.Digest, err, tc.scope, tc.digest)
		}
	}
}

// withHeaders is r with a copy of its outbox message carrying h.
func withHeaders(r CommitRequest, h map[string]string) CommitRequest {
	m := *r.Outbox
	m.Headers = h
	r.Outbox = &m
	return r
}

func publicationCommit() CommitRequest {
	r := validCommit()
	r.Sink = "rabbitmq"
	r.Target, r.PayloadSHA256 = "", ""
	r.Outbox = &OutboxMessage{Exchange: "starintel.results", RoutingKey: "target.result", ContentType: "application/json",
		Body: []byte(`{}`), Headers: map[string]string{"x-schema": "port-scan/v2", "Tenant-Hint": "a\tb é"}}
	return r
}

func TestOutboxHeaders(t *testing.T) {
	if _, _, err := PrepareCommit(publicationCommit(), StoreOptions{}); err != nil {
		t.Fatalf("valid headers: %v", err)
	}
	many := map[string]string{}
	for i := range MaxOutboxHeaders {
		many[fmt.Sprintf("h-%02d", i)] = "v"
	}
	// At the bounds: 32 headers; a 128-byte name; a 4096-byte value; 16 KiB
	// of names and values in all.
	full := map[string]string{}
	for i := range 4 {
		full[fmt.Sprintf("%0128d", i)] = strings.Repeat("v", MaxOutboxHeaderValueBytes-MaxOutboxHeaderNameBytes)
	}
	for name, h := range map[string]map[string]string{"32 headers": many, "16 KiB": full,
		"printable name": {"!~#": ""}, "empty value": {"e": ""}, "reserved prefix inside": {"my-x-starintel-x": "v"}} {
		if _, _, err := PrepareCommit(withHeaders(publicationCommit(), h), StoreOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	with := func(h map[string]string, k, v string) map[string]string {
		out := maps.Clone(h)
		out[k] = v
		return out
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		reason  string
	}{
		{"33 headers", with(many, "h-32", "v"), "at most 32 headers"},
		{"empty name", map[string]string{"": "v"}, "a header name must be 1 to 128 printable ASCII bytes without spaces"},
		{"129-byte name", map[string]string{strings.Repeat("n", 129): "v"}, "a header name must be 1 to 128 printable ASCII bytes without spaces"},
		{"space in name", map[string]string{"a b": "v"}, "a header name must be 1 to 128 printable ASCII bytes without spaces"},
		{"non-ASCII name", map[string]string{"é": "v"}, "a header name must be 1 to 128 printable ASCII bytes without spaces"},
		{"DEL in name", map[string]string{"a\x7f": "v"}, "a header name must be 1 to 128 printable ASCII bytes without spaces"},
		{"reserved name", map[string]string{"x-starintel-fencing-token": "1"}, "header names starting with x-starintel- are reserved for the fence headers"},
		{"reserved name, mixed case", map[string]string{"X-StarIntel-Fencing-Token": "1"}, "header names starting with x-starintel- are reserved for the fence headers"},
		{"reserved prefix alone", map[string]string{"X-STARINTEL-": "1"}, "header names starting with x-starintel- are reserved for the fence headers"},
		{"newline in value", map[string]string{"a": "x\ny"}, "a header value must be UTF-8 without control characters (tab allowed)"},
		{"NUL in value", map[string]string{"a": "\x00"}, "a header value must be UTF-8 without control characters (tab allowed)"},
		{"C1 control in value", map[string]string{"a": "\u0085"}, "a header value must be UTF-8 without control characters (tab allowed)"},
		{"value not UTF-8", map[string]string{"a": "\xff"}, "a header value must be UTF-8 without control characters (tab allowed)"},
		{"4097-byte value", map[string]string{"a": strings.Repeat("v", 4097)}, "a header value must be at most 4096 bytes"},
		{"over 16 KiB", with(full, "z", ""), "header names and values must total at most 16384 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pc, err := PrepareCommit(withHeaders(publicationCommit(), tc.headers), StoreOptions{})
			if pc != (PreparedCommit{}) {
				t.Errorf("prepared %+v", pc)
			}
			wantErr(t, err, CodeInvalidRequest, "outbox.headers", tc.reason)
		})
	}
	prep := func(r CommitRequest) (Prepared, error) {
		_, pc, err := PrepareCommit(r, StoreOptions{})
		return Prepared{Scope: pc.Scope, Digest: pc.Digest}, err
	}
	h := func(r *CommitRequest, kv ...string) {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		*r = withHeaders(*r, m)
	}
	runDigestCases(t, publicationCommit, prep, []digestCase[CommitRequest]{
		{"same headers, built in another order", func(r *CommitRequest) { h(r, "Tenant-Hint", "a\tb é", "x-schema", "port-scan/v2") }, false, false},
		{"a value", func(r *CommitRequest) { h(r, "x-schema", "port-scan/v3", "Tenant-Hint", "a\tb é") }, true, false},
		{"a name's case", func(r *CommitRequest) { h(r, "X-Schema", "port-scan/v2", "Tenant-Hint", "a\tb é") }, true, false},
		{"one header fewer", func(r *CommitRequest) { h(r, "x-schema", "port-scan/v2") }, true, false},
		{"no headers", func(r *CommitRequest) { h(r) }, true, false},
		{"the boundary between name and value", func(r *CommitRequest) { h(r, "x-schemap", "ort-scan/v2", "Tenant-Hint", "a\tb é") }, true, false},
	})
}

func TestOutboxEntryHeaders(t *testing.T) {
	e := OutboxEntry{MessageID: "msg_1", Identity: contractIdentity(), LockKey: goldenContractKey, LeaseID: "lease_01",
		FencingToken: 42, ExecutionID: "execution_01", Sink: "rabbitmq", CommitID: "commit_01", AcceptedAt: UnixMilli(1),
		Message: OutboxMessage{RoutingKey: "q", Body: []byte("x"), Headers: map[string]string{"b": "2", "a": "1\t\""}}}
	b, err := EncodeOutboxEntry(e)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"headers":{"a":"1\t\"","b":"2"}`) {
		t.Fatalf("stored entry %s", b)
	}
	got, err := DecodeOutboxEntry(b)
	if err != nil || !maps.Equal(got.Message.Headers, e.Message.Headers) {
		t.Fatalf("decoded %+v, %v", got.Message, err)
	}
	// An entry stored before headers existed has no headers key: it
	// decodes, without headers, and encodes to the same bytes.
	old := e
	old.Message.Headers = nil
	ob, _ := EncodeOutboxEntry(old)
	if strings.Contains(string(ob), "headers") {
		t.Fatalf("a header-less entry encodes headers: %s", ob)
	}
	if got, err := DecodeOutboxEntry(ob); err != nil || got.Message.Headers != nil {
		t.Fatalf("header-less entry: %+v, %v", got.Message, err)
	}
	// Stored headers are held to the request's bounds, and decoded strictly.
	for name, raw := range map[string]string{
		"reserved name":   strings.Replace(string(b), `"b":"2"`, `"X-Starintel-Lease-Id":"2"`, 1),
		"number value":    strings.Replace(string(b), `"b":"2"`, `"b":2`, 1),
		"duplicate name":  strings.Replace(string(b), `"b":"2"`, `"a":"2"`, 1),
		"headers not map": strings.Replace(string(b), `{"a":"1\t\"","b":"2"}`, `["a"]`, 1),
	} {
		if _, err := DecodeOutboxEntry([]byte(raw)); CodeOf(err) != CodeCorrupt {
			t.Errorf("%s: decoded (%v) %s", name, err, raw)
		}
	}
	bad := e
	bad.Message.Headers = map[string]string{"x-starintel-sink": "forged"}
	if _, err := EncodeOutboxEntry(bad); CodeOf(err) != CodeCorrupt {
		t.Errorf("encoded an entry with a reserved header: %v", err)
	}
}
