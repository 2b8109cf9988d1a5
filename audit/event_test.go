package audit

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name  string
		base  func() Event
		edit  func(*Event)
		field string // "" means valid
	}{
		{"acquire allowed", nil, func(e *Event) {}, ""},
		{"deny conflict", func() Event { return denyEvent(t0) }, func(e *Event) {}, ""},
		{"revoke allowed", func() Event { return revokeEvent(t0) }, func(e *Event) {}, ""},
		{"revoke with incident only", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "" }, ""},
		{"revoke with reason only", func() Event { return revokeEvent(t0) }, func(e *Event) { e.IncidentID = "" }, ""},
		{"revoke denied without reason", func() Event { return revokeEvent(t0) }, func(e *Event) {
			e.Reason, e.IncidentID = "", ""
			e.SetResult(lease.CodeInvalidRequest)
		}, ""},
		{"minimal auth failure", func() Event {
			e := NewEvent(EventAuthFailed, t0)
			e.CorrelationID = "corr_9"
			e.SetResult(lease.CodeInvalidCredential)
			return e
		}, func(e *Event) {}, ""},
		{"credential issue without correlation", func() Event {
			e := NewEvent(EventCredentialIssue, t0)
			e.PrincipalClass, e.PrincipalID, e.CredentialID = PrincipalAdministrator, "prn_admin", "01J0000000000000000000000A"
			e.Decision = DecisionAllow // credentials have no result code of their own
			return e
		}, func(e *Event) {}, ""},
		{"credential denied", func() Event {
			e := NewEvent(EventCredentialRevoke, t0)
			e.SetResult(lease.CodeAccessDenied)
			return e
		}, func(e *Event) {}, ""},
		{"dropped aggregate", func() Event { return dropped(t0, 7, DroppedUnauthenticated) }, func(e *Event) {}, ""},
		{"dropped aggregate of one principal", func() Event { return dropped(t0, 7, DroppedAuthenticated) }, func(e *Event) { e.PrincipalID = "prn-a" }, ""},
		{"high priority raised", nil, func(e *Event) { e.Priority = PriorityHigh }, ""},

		// closed type and required fields
		{"unknown type", nil, func(e *Event) { e.EventType = "target_lease_delete" }, "event_type"},
		{"empty type", nil, func(e *Event) { e.EventType = "" }, "event_type"},
		{"missing event id", nil, func(e *Event) { e.EventID = "" }, "event_id"},
		{"event id not a ulid", nil, func(e *Event) { e.EventID = "event_01" }, "event_id"},
		{"event id lower case", nil, func(e *Event) { e.EventID = strings.ToLower(e.EventID) }, "event_id"},
		{"missing timestamp", nil, func(e *Event) { e.Timestamp = lease.Timestamp{} }, "timestamp"},
		{"missing priority", nil, func(e *Event) { e.Priority = "" }, "priority"},
		{"unknown priority", nil, func(e *Event) { e.Priority = "urgent" }, "priority"},
		{"revoke at normal priority", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Priority = PriorityNormal }, "priority"},
		{"force release at normal priority", func() Event {
			e := revokeEvent(t0)
			e.EventType, e.ResultingState = EventForceRelease, lease.StateReleased
			e.SetResult(lease.CodeForceReleased)
			return e
		}, func(e *Event) { e.Priority = PriorityNormal }, "priority"},
		{"missing decision", nil, func(e *Event) { e.Decision = "" }, "decision"},
		{"unknown decision", nil, func(e *Event) { e.Decision = "maybe" }, "decision"},
		{"missing result code", nil, func(e *Event) { e.ResultCode = "" }, "result_code"},
		{"unknown result code", nil, func(e *Event) { e.ResultCode = "ok" }, "result_code"},
		{"retryable mismatch", func() Event { return denyEvent(t0) }, func(e *Event) { e.Retryable = false }, "retryable"},
		{"success denied", nil, func(e *Event) { e.Decision = DecisionDeny }, "decision"},
		{"access denied allowed", nil, func(e *Event) { e.SetResult(lease.CodeAccessDenied); e.Decision = DecisionAllow }, "decision"},
		{"auth failure with other code", nil, func(e *Event) { e.EventType = EventAuthFailed; e.SetResult(lease.CodeAccessDenied) }, "result_code"},
		{"missing correlation id", nil, func(e *Event) { e.CorrelationID = "" }, "correlation_id"},
		{"negative latency", nil, func(e *Event) { e.LatencyMS = -1 }, "latency_ms"},
		{"dropped count on request event", nil, func(e *Event) { e.DroppedCount = 1 }, "dropped_count"},
		{"dropped without count", func() Event { return dropped(t0, 1, DroppedAuthenticated) }, func(e *Event) { e.DroppedCount = 0 }, "dropped_count"},
		{"dropped with request fields", func() Event { return dropped(t0, 1, DroppedAuthenticated) }, func(e *Event) { e.TenantID = "tenant-main" }, "event_type"},
		{"dropped with another reason", func() Event { return dropped(t0, 1, DroppedAuthenticated) }, func(e *Event) { e.Reason = "because" }, "reason"},
		{"dropped unauthenticated naming a principal", func() Event { return dropped(t0, 1, DroppedUnauthenticated) }, func(e *Event) { e.PrincipalID = "prn-a" }, "principal_id"},
		{"dropped naming a bad principal id", func() Event { return dropped(t0, 1, DroppedAuthenticated) }, func(e *Event) { e.PrincipalID = "a b" }, "principal_id"},

		// identifiers
		{"request id with space", nil, func(e *Event) { e.RequestID = "req 1" }, "request_id"},
		{"trace id with slash", nil, func(e *Event) { e.TraceID = "a/b" }, "trace_id"},
		{"job id starting with dash", nil, func(e *Event) { e.JobID = "-job" }, "job_id"},
		{"execution id too long", nil, func(e *Event) { e.ExecutionID = strings.Repeat("x", 257) }, "execution_id"},
		{"principal id with dotdot", nil, func(e *Event) { e.PrincipalID = "a..b" }, "principal_id"},
		{"credential id non-ascii", nil, func(e *Event) { e.CredentialID = "kéy" }, "credential_id"},
		{"instance id with newline", nil, func(e *Event) { e.ServiceInstanceID = "i\n" }, "service_instance_id"},
		{"lease id with colon-first", nil, func(e *Event) { e.LeaseID = ":lease" }, "lease_id"},
		{"tenant not canonical (case)", nil, func(e *Event) { e.TenantID = "Tenant-Main" }, "tenant_id"},
		{"program with space", nil, func(e *Event) { e.ProgramID = " program-a" }, "program_id"},
		{"namespace with pattern", nil, func(e *Event) { e.TargetNamespace = "star*" }, "target_namespace"},
		{"target path", nil, func(e *Event) { e.TargetID = "../etc" }, "target_id"},
		{"actor too long", nil, func(e *Event) { e.ActorName = strings.Repeat("x", 257) }, "actor_name"},
		{"workflow with control", nil, func(e *Event) { e.WorkflowName = "wf\x00" }, "workflow_name"},
		{"operation class with slash", nil, func(e *Event) { e.OperationClass = "a/b" }, "operation_class"},
		{"unknown principal class", nil, func(e *Event) { e.PrincipalClass = "root" }, "principal_class"},
		{"fencing token zero", nil, func(e *Event) { e.SetFencingToken(0) }, "fencing_token"},
		{"fencing token past 2^53-1", nil, func(e *Event) { e.SetFencingToken(lease.MaxFencingToken + 1) }, "fencing_token"},
		{"negative requested ttl", nil, func(e *Event) { e.RequestedTTLMS = -5 }, "requested_ttl_ms"},
		{"effective ttl past ceiling", nil, func(e *Event) { e.EffectiveTTLMS = lease.MaxTTL.Milliseconds() + 1 }, "effective_ttl_ms"},
		{"unknown deadline class", nil, func(e *Event) { e.DeadlineClass = "forever" }, "deadline_class"},
		{"unknown previous state", nil, func(e *Event) { e.PreviousState = "locked" }, "previous_state"},
		{"unknown resulting state", nil, func(e *Event) { e.ResultingState = "gone" }, "resulting_state"},
		{"unknown backend health", nil, func(e *Event) { e.BackendHealth = "fine" }, "backend_health"},

		// administrator fields
		{"reason on acquire", nil, func(e *Event) { e.Reason = "because" }, "reason"},
		{"incident on acquire", nil, func(e *Event) { e.IncidentID = "inc-1" }, "reason"},
		{"revoke allowed without reason or incident", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason, e.IncidentID = "", "" }, "reason"},
		{"revoke allowed by non-administrator", func() Event { return revokeEvent(t0) }, func(e *Event) { e.PrincipalClass = PrincipalAPIClient }, "principal_class"},
		{"revoke allowed without credential", func() Event { return revokeEvent(t0) }, func(e *Event) { e.CredentialID = "" }, "principal_class"},
		{"reason with newline", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "ok\nforged line" }, "reason"},
		{"reason with escape", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "red \x1b[31m" }, "reason"},
		{"reason with bidi override", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "abc\u202edef" }, "reason"},
		{"reason with line separator", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "abc\u2028def" }, "reason"},
		{"reason blank", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "   " }, "reason"},
		{"reason too long", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = strings.Repeat("r", 513) }, "reason"},
		{"reason invalid utf-8", func() Event { return revokeEvent(t0) }, func(e *Event) { e.Reason = "bad \xff" }, "reason"},
		{"incident id with space", func() Event { return revokeEvent(t0) }, func(e *Event) { e.IncidentID = "inc 1" }, "incident_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := acquireEvent(t0)
			if c.base != nil {
				e = c.base()
			}
			c.edit(&e)
			err := e.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("valid event refused: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a ValidationError on %s", err, c.field)
			}
			if ve.Field != c.field {
				t.Fatalf("refused on %s (%s), want %s", ve.Field, ve.Reason, c.field)
			}
			// An error never echoes the refused value.
			if strings.Contains(err.Error(), "star_sk_") || strings.Contains(err.Error(), "forged") ||
				strings.Contains(err.Error(), "Bearer") {
				t.Fatalf("error echoes the value: %v", err)
			}
			if _, err := Marshal(e); err == nil {
				t.Fatal("Marshal encoded an invalid event")
			}
		})
	}
}

func TestEveryTypeValidates(t *testing.T) {
	if got := len(EventTypes()); got != 23 {
		t.Fatalf("%d event types, want 15 request/credential types, 5 recovery types, 2 outbox types and audit_dropped", got)
	}
	for _, typ := range EventTypes() {
		var e Event
		switch {
		case typ == EventDropped:
			e = dropped(t0, 1, DroppedAuthenticated)
		case typ.Admin():
			e = revokeEvent(t0)
			e.EventType = typ
		case typ.OperatorStep():
			e = NewEvent(typ, t0)
			e.Decision, e.Reason = DecisionAllow, "epoch path: counters raised to 1000042"
		case typ == EventAuthFailed:
			e = NewEvent(typ, t0)
			e.CorrelationID = "corr_1"
			e.SetResult(lease.CodeInvalidCredential)
		default:
			e = denyEvent(t0)
			e.EventType = typ
		}
		if e.Priority != PriorityOf(typ) && !typ.Admin() {
			t.Errorf("%s: priority %s", typ, e.Priority)
		}
		if err := e.Validate(); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
	if PriorityOf(EventForceRelease) != PriorityHigh || PriorityOf(EventRevoke) != PriorityHigh ||
		PriorityOf(EventAcquire) != PriorityNormal || PriorityOf(EventRecoveryVerify) != PriorityHigh ||
		PriorityOf(EventOutboxRequeue) != PriorityHigh || PriorityOf(EventOutboxDiscard) != PriorityHigh {
		t.Fatal("PriorityOf")
	}
	// A recovery event without its reason, or at normal priority, is refused.
	e := NewEvent(EventRecoveryReopen, t0)
	e.Decision = DecisionAllow
	if err := e.Validate(); err == nil {
		t.Fatal("a recovery event without a reason validated")
	}
	e.Reason, e.Priority = "reopened", PriorityNormal
	if err := e.Validate(); err == nil {
		t.Fatal("a normal-priority recovery event validated")
	}
	// Likewise an operator's outbox step.
	for _, typ := range []EventType{EventOutboxRequeue, EventOutboxDiscard} {
		e := NewEvent(typ, t0)
		e.Decision = DecisionAllow
		if err := e.Validate(); err == nil {
			t.Fatalf("%s without a reason validated", typ)
		}
		e.Reason, e.Priority = "dead letter msg_1 requeued: exchange declared", PriorityNormal
		if err := e.Validate(); err == nil {
			t.Fatalf("%s at normal priority validated", typ)
		}
	}
}

// documented is the contract's audit field list, written out independently
// of the package's own Fields.
var documented = []string{
	"event_id", "event_type", "timestamp", "latency_ms",
	"request_id", "correlation_id", "decision", "trace_id", "execution_id", "job_id",
	"principal_class", "principal_id", "credential_id", "service_instance_id",
	"tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name", "operation_class",
	"lease_id", "fencing_token", "requested_ttl_ms", "effective_ttl_ms", "deadline_class",
	"previous_state", "resulting_state", "result_code", "retryable", "backend_health",
	"reason", "incident_id", "priority", "dropped_count",
}

func keySet(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestEncodingFieldSet(t *testing.T) {
	if !slices.Equal(Fields(), documented) {
		t.Fatalf("Fields() = %v\nwant %v", Fields(), documented)
	}
	optional := map[string]bool{"lease_id": true, "fencing_token": true, "reason": true, "incident_id": true, "dropped_count": true}
	var always []string
	for _, f := range documented {
		if !optional[f] {
			always = append(always, f)
		}
	}
	slices.Sort(always)

	// A full event: every field but dropped_count.
	full := revokeEvent(t0)
	full.LatencyMS, full.TraceID, full.ExecutionID, full.JobID = 9, "trace_1", "execution_1", "job_1"
	full.ServiceInstanceID, full.RequestedTTLMS, full.EffectiveTTLMS, full.DeadlineClass = "instance_1", 1, 1, DeadlineCapped
	b, err := Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(always), "lease_id", "fencing_token", "reason", "incident_id")))
	if got := keySet(t, b); !slices.Equal(got, want) {
		t.Fatalf("full event keys %v\nwant %v", got, want)
	}

	// A minimal event emits every always-present field and no optional one.
	min := NewEvent(EventAuthFailed, t0)
	min.CorrelationID = "corr_1"
	min.SetResult(lease.CodeInvalidCredential)
	b, err = Marshal(min)
	if err != nil {
		t.Fatal(err)
	}
	if got := keySet(t, b); !slices.Equal(got, always) {
		t.Fatalf("minimal event keys %v\nwant %v", got, always)
	}

	// Every key of every encoding is documented, and the timestamp has the
	// contract form.
	for _, e := range []Event{acquireEvent(t0), denyEvent(t0), dropped(t0, 3, "")} {
		b, err := Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keySet(t, b) {
			if !slices.Contains(documented, k) {
				t.Fatalf("undocumented field %q in %s", k, b)
			}
		}
		if !strings.Contains(string(b), `"timestamp":"2026-08-05T12:00:00.000Z"`) {
			t.Fatalf("timestamp form: %s", b)
		}
	}
	b, _ = Marshal(dropped(t0, 3, ""))
	if got, want := keySet(t, b), slices.Sorted(slices.Values(append(slices.Clone(always), "dropped_count"))); !slices.Equal(got, want) {
		t.Fatalf("dropped event keys %v\nwant %v", got, want)
	}
}

func TestNewEvent(t *testing.T) {
	e := NewEvent(EventRelease, t0.Add(1500*time.Microsecond))
	id, err := ulid.ParseStrict(e.EventID)
	if err != nil {
		t.Fatal(err)
	}
	if id.Time() != uint64(e.Timestamp.UnixMilli()) {
		t.Fatalf("id time %d, timestamp %d", id.Time(), e.Timestamp.UnixMilli())
	}
	if e.Timestamp.String() != "2026-08-05T12:00:00.001Z" {
		t.Fatalf("timestamp %s", e.Timestamp)
	}
	if a, b := NewEvent(EventAcquire, t0), NewEvent(EventAcquire, t0); a.EventID == b.EventID {
		t.Fatal("event ids repeat")
	}
	var ev Event
	ev.SetResult(lease.CodeOutcomeUnknown)
	if ev.Decision != DecisionDeny || !ev.Retryable {
		t.Fatalf("SetResult: %+v", ev)
	}
}

func TestUnmarshalStrict(t *testing.T) {
	good, err := Marshal(acquireEvent(t0))
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(good)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Marshal(back)
	if string(again) != string(good) {
		t.Fatalf("round trip changed the event:\n%s\n%s", good, again)
	}
	s := string(good)
	bad := map[string]string{
		"unknown field":   strings.Replace(s, `{`, `{"metadata":"x",`, 1),
		"lock key field":  strings.Replace(s, `{`, `{"lock_key":"starintel:target-lease:v1:x",`, 1),
		"duplicate field": strings.Replace(s, `{`, `{"tenant_id":"other",`, 1),
		"null value":      strings.Replace(s, `"job_id":"job_01"`, `"job_id":null`, 1),
		"nested value":    strings.Replace(s, `"job_id":"job_01"`, `"job_id":{"a":1}`, 1),
		"wrong type":      strings.Replace(s, `"latency_ms":3`, `"latency_ms":"3"`, 1),
		"trailing data":   s + `{}`,
		"not an object":   `[1]`,
		"bad timestamp":   strings.Replace(s, `12:00:00.000Z`, `12:00:00Z`, 1),
		"invalid event":   strings.Replace(s, `"decision":"allow"`, `"decision":"deny"`, 1),
		"empty":           ``,
	}
	for name, in := range bad {
		if _, err := Unmarshal([]byte(in)); err == nil {
			t.Errorf("%s: accepted %s", name, in)
		}
	}
}

// Event ids made for one millisecond increase in the order they are made.
func TestEventIDsOfOneMillisecondKeepTheirOrder(t *testing.T) {
	now := time.Now()
	prev := NewEventID(now)
	for i := 0; i < 10000; i++ {
		id := NewEventID(now)
		if id <= prev {
			t.Fatalf("id %d: %s after %s", i, id, prev)
		}
		prev = id
	}
}
