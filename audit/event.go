package audit

import (
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
)

// EventType is the closed set of audit event types.
type EventType string

// The request event types: one event per request, whatever its result.
const (
	EventAcquire      EventType = "target_lease_acquire"
	EventRenew        EventType = "target_lease_renew"
	EventRelease      EventType = "target_lease_release"
	EventForceRelease EventType = "target_lease_force_release"
	EventRevoke       EventType = "target_lease_revoke"
	EventInspect      EventType = "target_lease_inspect"
	EventList         EventType = "target_lease_list"
	EventHistory      EventType = "target_lease_history"
	// EventCommitAuthorized and EventCommitRejected are the two outcomes of
	// a fenced-write validation.
	EventCommitAuthorized EventType = "target_lease_commit_authorized"
	EventCommitRejected   EventType = "target_lease_commit_rejected"
	// EventLookup is a lookup of a mutation's stored result by request id.
	EventLookup EventType = "target_lease_lookup"
	// EventAuthFailed is an authentication failure before any lease access.
	EventAuthFailed EventType = "target_lease_auth_failed"

	EventCredentialIssue  EventType = "credential_issue"
	EventCredentialRevoke EventType = "credential_revoke"
	EventCredentialRotate EventType = "credential_rotate"

	// The recovery event types, written by the backup, restore and
	// verify-restore tools: each step that can change what tokens the
	// namespace will issue, with its details in reason.
	EventRecoveryBackup  EventType = "recovery_backup"
	EventRecoveryRestore EventType = "recovery_restore"
	// EventRecoveryVerify records recovery's decision (complete proof or
	// epoch path); EventRecoveryRevoke each restored lease it ended;
	// EventRecoveryReopen the namespace reopening, or (deny) staying closed.
	EventRecoveryVerify EventType = "recovery_verify"
	EventRecoveryRevoke EventType = "recovery_lease_revoked"
	EventRecoveryReopen EventType = "recovery_reopened"

	// An operator's requeue or discard of an outbox dead letter (the
	// `starlease outbox` command): like recovery steps, high priority
	// with the details in reason.
	EventOutboxRequeue EventType = "outbox_dead_letter_requeued"
	EventOutboxDiscard EventType = "outbox_dead_letter_discarded"
)

// EventDropped is the one event type the audit package writes itself: the
// Limiter's periodic count of normal-priority deny/error events it did not
// write individually. It carries only event_id, event_type, timestamp,
// priority, dropped_count and, as reason, whose events they were
// (DroppedAuthenticated or DroppedUnauthenticated), with principal_id when
// they were one authenticated principal's.
const EventDropped EventType = "audit_dropped"

// The reasons of an audit_dropped event: the Limiter budget it counts.
const (
	DroppedAuthenticated   = "authenticated requests"
	DroppedUnauthenticated = "unauthenticated requests"
)

var eventTypes = map[EventType]bool{
	EventAcquire: true, EventRenew: true, EventRelease: true, EventForceRelease: true,
	EventRevoke: true, EventInspect: true, EventList: true, EventHistory: true,
	EventCommitAuthorized: true, EventCommitRejected: true, EventLookup: true,
	EventAuthFailed: true, EventCredentialIssue: true, EventCredentialRevoke: true,
	EventCredentialRotate: true, EventDropped: true,
	EventRecoveryBackup: true, EventRecoveryRestore: true, EventRecoveryVerify: true,
	EventRecoveryRevoke: true, EventRecoveryReopen: true,
	EventOutboxRequeue: true, EventOutboxDiscard: true,
}

// EventTypes returns every member of the closed set, EventDropped included.
func EventTypes() []EventType {
	out := make([]EventType, 0, len(eventTypes))
	for t := range eventTypes {
		out = append(out, t)
	}
	return out
}

// Known reports whether t is one of the closed set.
func (t EventType) Known() bool { return eventTypes[t] }

// Admin reports whether t is an administrative invalidation
// (force-release or revoke): high priority, reason or incident id.
func (t EventType) Admin() bool { return t == EventForceRelease || t == EventRevoke }

// leaseOp reports whether t is a target_lease_* request event.
func (t EventType) leaseOp() bool { return strings.HasPrefix(string(t), "target_lease_") }

// credential reports whether t is a credential_* management event.
func (t EventType) credential() bool { return strings.HasPrefix(string(t), "credential_") }

// Recovery reports a recovery step's event type: high priority, with its
// details in reason and no lease result code of its own.
func (t EventType) Recovery() bool { return strings.HasPrefix(string(t), "recovery_") }

// OperatorStep reports an event an operator's command writes: a recovery
// step or a change to the outbox's dead letters. Such events are high
// priority, carry their details in reason and no lease result code.
func (t EventType) OperatorStep() bool {
	return t.Recovery() || strings.HasPrefix(string(t), "outbox_dead_letter_")
}

// CutReason keeps a reason within the audit schema's bound
// (lease.MaxReasonBytes), cutting at a rune boundary.
func CutReason(r string) string {
	if len(r) <= lease.MaxReasonBytes {
		return r
	}
	r = r[:lease.MaxReasonBytes-3]
	for len(r) > 0 && !utf8.ValidString(r) {
		r = r[:len(r)-1]
	}
	return r + "..."
}

// Decision is the authorization outcome of a request.
type Decision string

const (
	DecisionAllow Decision = "allow"
	DecisionDeny  Decision = "deny"
)

// Priority is an event's durability class.
type Priority string

const (
	// PriorityNormal events may be aggregated by a Limiter when they are
	// deny/error floods.
	PriorityNormal Priority = "normal"
	// PriorityHigh events (force-release, revoke) are written durably before
	// the operation reports success and are never dropped.
	PriorityHigh Priority = "high"
)

// PriorityOf is the priority an event type requires: high for
// force-release, revoke and operators' steps, normal otherwise. A caller may raise any event
// to high; Validate refuses force-release or revoke at normal.
func PriorityOf(t EventType) Priority {
	if t.Admin() || t.OperatorStep() {
		return PriorityHigh
	}
	return PriorityNormal
}

// Deadline classes: where the effective deadline came from.
const (
	DeadlineDefault = "default" // the server default; the caller gave none
	DeadlineClient  = "client"  // the caller's deadline, within the server cap
	DeadlineCapped  = "capped"  // the caller's deadline, cut to the server cap
)

// Principal classes (the auth boundary's closed list).
const (
	PrincipalAPIClient       = "api_client"
	PrincipalServiceInstance = "service_instance"
	PrincipalActorComponent  = "actor_component"
	PrincipalAdministrator   = "administrator"
)

// Bounds.
const (
	// MaxEventBytes bounds one encoded event (one JSON line without its
	// newline). The field bounds keep real events far below it.
	MaxEventBytes = 16 << 10
	// maxJSONInt is the largest integer every JSON reader holds exactly.
	maxJSONInt = 1<<53 - 1
)

// Event is one audit event. Its JSON form is exactly the contract's list of
// audit fields (Fields); lease_id, fencing_token, reason, incident_id and
// dropped_count are omitted when empty, every other field is always present.
//
// Every value must come from trusted, normalized sources: the
// authenticated principal, the canonical identity, the typed result. Never
// copy a raw request value or an error's text into an event.
type Event struct {
	EventID   string          `json:"event_id"`   // ULID, time-ordered
	EventType EventType       `json:"event_type"` // closed set
	Timestamp lease.Timestamp `json:"timestamp"`  // backend/server time
	LatencyMS int64           `json:"latency_ms"`

	RequestID     string   `json:"request_id"`
	CorrelationID string   `json:"correlation_id"`
	Decision      Decision `json:"decision"`
	TraceID       string   `json:"trace_id"`
	ExecutionID   string   `json:"execution_id"`
	JobID         string   `json:"job_id"`

	PrincipalClass    string `json:"principal_class"`
	PrincipalID       string `json:"principal_id"`
	CredentialID      string `json:"credential_id"` // the non-secret id only
	ServiceInstanceID string `json:"service_instance_id"`

	TenantID        string `json:"tenant_id"`
	ProgramID       string `json:"program_id"`
	TargetNamespace string `json:"target_namespace"`
	TargetID        string `json:"target_id"`
	ActorName       string `json:"actor_name"`
	WorkflowName    string `json:"workflow_name"`
	OperationClass  string `json:"operation_class"`

	// LeaseID and FencingToken are set only when disclosing them to an
	// audit reader is safe; the caller decides.
	LeaseID      string  `json:"lease_id,omitempty"`
	FencingToken *uint64 `json:"fencing_token,omitempty"`

	RequestedTTLMS int64  `json:"requested_ttl_ms"`
	EffectiveTTLMS int64  `json:"effective_ttl_ms"`
	DeadlineClass  string `json:"deadline_class"`

	PreviousState  lease.State `json:"previous_state"`
	ResultingState lease.State `json:"resulting_state"`

	ResultCode    lease.Code         `json:"result_code"`
	Retryable     bool               `json:"retryable"`
	BackendHealth lease.HealthStatus `json:"backend_health"`

	// Reason and IncidentID only on force-release and revoke.
	Reason     string `json:"reason,omitempty"`
	IncidentID string `json:"incident_id,omitempty"`

	Priority Priority `json:"priority"`

	// DroppedCount only on EventDropped.
	DroppedCount int64 `json:"dropped_count,omitempty"`

	// keyed is set once a keyed Redactor gave the event its redacted
	// forms, so a second pass keeps them (not encoded).
	keyed bool
}

// fields is the documented JSON field list, in struct order.
var fields = []string{
	"event_id", "event_type", "timestamp", "latency_ms",
	"request_id", "correlation_id", "decision", "trace_id", "execution_id", "job_id",
	"principal_class", "principal_id", "credential_id", "service_instance_id",
	"tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name", "operation_class",
	"lease_id", "fencing_token",
	"requested_ttl_ms", "effective_ttl_ms", "deadline_class",
	"previous_state", "resulting_state",
	"result_code", "retryable", "backend_health",
	"reason", "incident_id",
	"priority",
	"dropped_count",
}

// Fields returns the closed list of JSON field names an event may carry.
func Fields() []string { return append([]string(nil), fields...) }

// eventIDs makes event ids; its entropy increases within a millisecond.
var eventIDs struct {
	sync.Mutex
	entropy *ulid.MonotonicEntropy
}

// NewEventID returns a new ULID event id for time t. Ids this process makes
// for one millisecond increase in the order they are made, so events read
// back in id order (the audit stores' order) keep the order in which they
// were made; with random entropy alone, events of one millisecond came
// back shuffled.
func NewEventID(t time.Time) string {
	eventIDs.Lock()
	defer eventIDs.Unlock()
	if eventIDs.entropy == nil {
		eventIDs.entropy = ulid.Monotonic(rand.Reader, 0)
	}
	id, err := ulid.New(ulid.Timestamp(t), eventIDs.entropy)
	if err != nil { // the millisecond's increments ran out: a random id
		return ulid.MustNew(ulid.Timestamp(t), rand.Reader).String()
	}
	return id.String()
}

// NewEvent starts an event of type t at server time now: event id,
// timestamp and the type's priority are set; the caller fills the rest.
func NewEvent(t EventType, now time.Time) Event {
	return Event{EventID: NewEventID(now), EventType: t, Timestamp: lease.At(now), Priority: PriorityOf(t)}
}

// SetScope copies the canonical lock identity into the event's scope.
func (e *Event) SetScope(id lease.Identity) {
	e.TenantID, e.ProgramID, e.TargetNamespace, e.TargetID = id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID
	e.ActorName, e.WorkflowName, e.OperationClass = id.ActorName, id.WorkflowName, id.OperationClass
}

// SetCaller copies the caller's non-secret security context: principal
// class and id, credential id and correlation id (the client id is not an
// audit field).
func (e *Event) SetCaller(c lease.Caller) {
	e.PrincipalClass, e.PrincipalID, e.CredentialID = c.PrincipalClass, c.PrincipalID, c.CredentialID
	if c.CorrelationID != "" {
		e.CorrelationID = c.CorrelationID
	}
}

// SetResult sets result_code, retryable and the decision a code implies:
// allow for a success code, deny otherwise.
func (e *Event) SetResult(c lease.Code) {
	e.ResultCode, e.Retryable = c, c.Retryable()
	if c.Success() {
		e.Decision = DecisionAllow
	} else {
		e.Decision = DecisionDeny
	}
}

// SetFencingToken discloses the fencing token.
func (e *Event) SetFencingToken(t uint64) { e.FencingToken = &t }

// ValidationError reports an invalid event. It names the field and never
// echoes its value, which may be exactly what the guard refused.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return "audit: invalid event: " + e.Field + ": " + e.Reason }

func invalid(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// strs lists every string-valued field with its JSON name.
func (e *Event) strs() []struct{ name, v string } {
	return []struct{ name, v string }{
		{"event_id", e.EventID}, {"event_type", string(e.EventType)},
		{"request_id", e.RequestID}, {"correlation_id", e.CorrelationID}, {"decision", string(e.Decision)},
		{"trace_id", e.TraceID}, {"execution_id", e.ExecutionID}, {"job_id", e.JobID},
		{"principal_class", e.PrincipalClass}, {"principal_id", e.PrincipalID},
		{"credential_id", e.CredentialID}, {"service_instance_id", e.ServiceInstanceID},
		{"tenant_id", e.TenantID}, {"program_id", e.ProgramID}, {"target_namespace", e.TargetNamespace},
		{"target_id", e.TargetID}, {"actor_name", e.ActorName}, {"workflow_name", e.WorkflowName},
		{"operation_class", e.OperationClass}, {"lease_id", e.LeaseID},
		{"deadline_class", e.DeadlineClass}, {"previous_state", string(e.PreviousState)},
		{"resulting_state", string(e.ResultingState)}, {"result_code", string(e.ResultCode)},
		{"backend_health", string(e.BackendHealth)}, {"reason", e.Reason}, {"incident_id", e.IncidentID},
		{"priority", string(e.Priority)},
	}
}

// checkStoredSecretFree refuses a stored event holding a value that may be
// credential material: Marshal never writes one (it redacts first), so
// such an event was not written by this package.
func (e *Event) checkStoredSecretFree() error {
	for _, f := range e.strs() {
		if lease.SecretShaped(f.v) {
			return invalid(f.name, "holds credential material; events are redacted before they are written")
		}
	}
	return nil
}

// Validate checks e against the closed schema: the closed type, required
// fields, identifier rules, bounds, consistency of decision, result code and
// retryability, and the administrator fields. It does not look for
// credential material: that is redacted, never refused (Redactor), so no
// value a caller chooses can make an event invalid.
func (e *Event) Validate() error {
	if !e.EventType.Known() {
		return invalid("event_type", "not a known event type")
	}
	if id, err := ulid.ParseStrict(e.EventID); err != nil || id.String() != e.EventID {
		return invalid("event_id", "must be a canonical ULID")
	}
	if e.Timestamp.IsZero() || e.Timestamp.Time().Year() < 1970 || e.Timestamp.Time().Year() > 9999 {
		return invalid("timestamp", "must be set")
	}
	switch e.Priority {
	case PriorityNormal, PriorityHigh:
	default:
		return invalid("priority", "must be normal or high")
	}
	if e.EventType.Admin() && e.Priority != PriorityHigh {
		return invalid("priority", "force-release and revoke are high priority")
	}
	if e.EventType == EventDropped {
		return e.validateDropped()
	}
	if e.DroppedCount != 0 {
		return invalid("dropped_count", "only on audit_dropped events")
	}
	if e.LatencyMS < 0 || e.LatencyMS > maxJSONInt {
		return invalid("latency_ms", "out of range")
	}
	if err := e.validateDecision(); err != nil {
		return err
	}
	if e.EventType.leaseOp() && e.CorrelationID == "" {
		return invalid("correlation_id", "required")
	}
	for _, f := range []struct{ name, v string }{
		{"request_id", e.RequestID}, {"correlation_id", e.CorrelationID}, {"trace_id", e.TraceID},
		{"execution_id", e.ExecutionID}, {"job_id", e.JobID}, {"principal_id", e.PrincipalID},
		{"credential_id", e.CredentialID}, {"service_instance_id", e.ServiceInstanceID},
		{"lease_id", e.LeaseID}, {"incident_id", e.IncidentID},
	} {
		if f.v == "" {
			continue
		}
		// A value that may be credential material is written redacted
		// (Marshal's floor at least), never refused: its shape is the
		// redacted form's. (CheckOpaqueID refuses any star_sk_ id.)
		if err := lease.CheckOpaqueID(f.name, (*Redactor)(nil).Value(f.v)); err != nil {
			return invalid(f.name, "must be an opaque identifier (ASCII letters, digits, . _ : -; at most 256 bytes)")
		}
	}
	for _, f := range []struct{ name, v string }{
		{"tenant_id", e.TenantID}, {"program_id", e.ProgramID}, {"target_namespace", e.TargetNamespace},
		{"target_id", e.TargetID}, {"actor_name", e.ActorName}, {"workflow_name", e.WorkflowName},
		{"operation_class", e.OperationClass},
	} {
		if f.v == "" {
			continue
		}
		if n, err := lease.NormalizeIdentifier(f.name, f.v); err != nil || n != f.v {
			return invalid(f.name, "must be a canonical identifier")
		}
	}
	switch e.PrincipalClass {
	case "", PrincipalAPIClient, PrincipalServiceInstance, PrincipalActorComponent, PrincipalAdministrator:
	default:
		return invalid("principal_class", "not a known principal class")
	}
	if e.FencingToken != nil && (*e.FencingToken == 0 || *e.FencingToken > lease.MaxFencingToken) {
		return invalid("fencing_token", "out of range")
	}
	if e.RequestedTTLMS < 0 || e.RequestedTTLMS > maxJSONInt {
		return invalid("requested_ttl_ms", "out of range")
	}
	if e.EffectiveTTLMS < 0 || e.EffectiveTTLMS > lease.MaxTTL.Milliseconds() {
		return invalid("effective_ttl_ms", "out of range")
	}
	switch e.DeadlineClass {
	case "", DeadlineDefault, DeadlineClient, DeadlineCapped:
	default:
		return invalid("deadline_class", "must be default, client or capped")
	}
	if e.PreviousState != "" && !e.PreviousState.Valid() {
		return invalid("previous_state", "not a lease state")
	}
	if e.ResultingState != "" && !e.ResultingState.Valid() {
		return invalid("resulting_state", "not a lease state")
	}
	switch e.BackendHealth {
	case "", lease.HealthOK, lease.HealthDegraded, lease.HealthUnsuitable, lease.HealthUnavailable:
	default:
		return invalid("backend_health", "not a health class")
	}
	return e.validateAdmin()
}

func (e *Event) validateDecision() error {
	switch e.Decision {
	case DecisionAllow, DecisionDeny:
	default:
		return invalid("decision", "must be allow or deny")
	}
	switch {
	case e.ResultCode == "" && (e.EventType.credential() || e.EventType.OperatorStep()):
		// Credential management has no lease result code of its own;
		// decision alone records the outcome.
	case !e.ResultCode.Known():
		return invalid("result_code", "not a known result code")
	}
	if e.Retryable != e.ResultCode.Retryable() {
		return invalid("retryable", "must match the result code")
	}
	if e.ResultCode.Success() && e.Decision != DecisionAllow {
		return invalid("decision", "a success result must be allowed")
	}
	switch e.ResultCode {
	case lease.CodeInvalidCredential, lease.CodeAccessDenied:
		if e.Decision != DecisionDeny {
			return invalid("decision", "an authentication or authorization failure must be denied")
		}
	}
	if e.EventType == EventAuthFailed && e.ResultCode != lease.CodeInvalidCredential {
		return invalid("result_code", "an authentication failure is invalid_credential")
	}
	return nil
}

func (e *Event) validateAdmin() error {
	if e.EventType.OperatorStep() {
		if e.Priority != PriorityHigh {
			return invalid("priority", "recovery and outbox events are high priority")
		}
		if e.Reason == "" || lease.CheckReason(e.Reason) != nil {
			return invalid("reason", "a recovery or outbox event needs a printable reason of at most 512 bytes")
		}
		return nil
	}
	if !e.EventType.Admin() {
		if e.Reason != "" || e.IncidentID != "" {
			return invalid("reason", "reason and incident_id only on force-release and revoke")
		}
		return nil
	}
	if err := lease.CheckReason(e.Reason); err != nil {
		return invalid("reason", "must be printable UTF-8 without control or format characters, not blank, at most 512 bytes")
	}
	if e.Decision == DecisionAllow {
		if e.Reason == "" && e.IncidentID == "" {
			return invalid("reason", "an allowed force-release or revoke needs a reason or incident id")
		}
		if e.PrincipalClass != PrincipalAdministrator || e.PrincipalID == "" || e.CredentialID == "" {
			return invalid("principal_class", "an allowed force-release or revoke needs an administrator principal and credential")
		}
	}
	return nil
}

// validateDropped allows only the aggregate's own fields.
func (e *Event) validateDropped() error {
	if e.DroppedCount <= 0 || e.DroppedCount > maxJSONInt {
		return invalid("dropped_count", "must be positive")
	}
	if e.Priority != PriorityNormal {
		return invalid("priority", "audit_dropped is normal priority")
	}
	switch e.Reason {
	case "", DroppedAuthenticated, DroppedUnauthenticated: // "": written before the budgets
	default:
		return invalid("reason", "audit_dropped names its budget or nothing")
	}
	// principal_id: whose events an authenticated budget dropped.
	if e.PrincipalID != "" {
		if e.Reason != DroppedAuthenticated {
			return invalid("principal_id", "only on an audit_dropped of authenticated requests")
		}
		if err := lease.CheckOpaqueID("principal_id", (*Redactor)(nil).Value(e.PrincipalID)); err != nil {
			return invalid("principal_id", "must be an opaque identifier (ASCII letters, digits, . _ : -; at most 256 bytes)")
		}
	}
	rest := *e
	rest.EventID, rest.EventType, rest.Timestamp, rest.Priority, rest.DroppedCount, rest.Reason, rest.PrincipalID = "", "", lease.Timestamp{}, "", 0, "", ""
	rest.keyed = false
	if rest != (Event{}) {
		return invalid("event_type", "audit_dropped carries only event_id, timestamp, priority, dropped_count, reason and principal_id")
	}
	return nil
}

// dropped builds the aggregate event of one budget.
func dropped(now time.Time, n int64, reason string) Event {
	e := NewEvent(EventDropped, now)
	e.DroppedCount, e.Reason = n, reason
	return e
}

// String is a short, non-secret description for logs.
func (e *Event) String() string {
	return fmt.Sprintf("audit event %s %s %s %s", e.EventID, e.EventType, e.Decision, e.ResultCode)
}
