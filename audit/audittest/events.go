package audittest

import (
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/lease"
)

// Event is a valid event of type typ with result code at time at, by an API
// client (an administrator, with an incident id, for an administrative
// type), with a fixed scope, request and correlation id.
func Event(typ audit.EventType, code lease.Code, at time.Time) audit.Event {
	e := audit.NewEvent(typ, at)
	e.CorrelationID = "corr_1"
	e.RequestID = "request_1"
	e.SetCaller(lease.Caller{PrincipalID: "prn_1", PrincipalClass: audit.PrincipalAPIClient, CredentialID: "key_1"})
	e.SetScope(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "ns",
		TargetID: "target_1", ActorName: "actor", WorkflowName: "default", OperationClass: "default"})
	e.SetResult(code)
	e.BackendHealth = lease.HealthOK
	if typ.Admin() {
		e.PrincipalClass = audit.PrincipalAdministrator
		e.IncidentID = "inc-1"
	}
	return e
}

// AcquireEvent is a complete, valid, allowed acquire event at time at:
// tenant "tenant-main", program "program-a", lease "lease_01", token 42.
func AcquireEvent(at time.Time) audit.Event {
	e := audit.NewEvent(audit.EventAcquire, at)
	e.LatencyMS = 3
	e.RequestID = "request_01"
	e.CorrelationID = "corr_01"
	e.TraceID = "trace_01"
	e.ExecutionID = "execution_01"
	e.JobID = "job_01"
	e.SetCaller(lease.Caller{PrincipalID: "prn_actor_01", PrincipalClass: audit.PrincipalActorComponent,
		ClientID: "client_01", CredentialID: "key_01"})
	e.ServiceInstanceID = "instance_01"
	e.SetScope(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target_01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"})
	e.LeaseID = "lease_01"
	e.SetFencingToken(42)
	e.RequestedTTLMS = 30000
	e.EffectiveTTLMS = 30000
	e.DeadlineClass = audit.DeadlineClient
	e.PreviousState = ""
	e.ResultingState = lease.StateActive
	e.SetResult(lease.CodeAcquired)
	e.BackendHealth = lease.HealthOK
	return e
}

// DenyEvent is a valid, normal-priority denied acquire (conflict) at time
// at: AcquireEvent without lease, token or resulting state.
func DenyEvent(at time.Time) audit.Event {
	e := AcquireEvent(at)
	e.LeaseID, e.FencingToken = "", nil
	e.ResultingState = ""
	e.SetResult(lease.CodeConflict)
	return e
}

// RevokeEvent is a valid, allowed, high-priority revoke at time at, by an
// administrator, of AcquireEvent's lease.
func RevokeEvent(at time.Time) audit.Event {
	e := audit.NewEvent(audit.EventRevoke, at)
	e.RequestID, e.CorrelationID = "request_02", "corr_02"
	e.PrincipalClass, e.PrincipalID, e.CredentialID = audit.PrincipalAdministrator, "prn_admin_01", "key_admin_01"
	e.SetScope(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target_01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"})
	e.LeaseID = "lease_01"
	e.SetFencingToken(42)
	e.PreviousState, e.ResultingState = lease.StateActive, lease.StateRevoked
	e.SetResult(lease.CodeRevoked)
	e.BackendHealth = lease.HealthOK
	e.Reason = "compromised worker host"
	e.IncidentID = "inc-2026-0042"
	return e
}
