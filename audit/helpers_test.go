package audit

import (
	"time"

	"github.com/starintel/starlease/lease"
)

var t0 = time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)

// acquireEvent, denyEvent and revokeEvent are audittest.AcquireEvent,
// DenyEvent and RevokeEvent for this package's own tests, which cannot
// import audittest (it imports audit); keep them the same.

// acquireEvent is a complete, valid, allowed acquire event.
func acquireEvent(at time.Time) Event {
	e := NewEvent(EventAcquire, at)
	e.LatencyMS = 3
	e.RequestID = "request_01"
	e.CorrelationID = "corr_01"
	e.TraceID = "trace_01"
	e.ExecutionID = "execution_01"
	e.JobID = "job_01"
	e.SetCaller(lease.Caller{PrincipalID: "prn_actor_01", PrincipalClass: PrincipalActorComponent,
		ClientID: "client_01", CredentialID: "key_01"})
	e.ServiceInstanceID = "instance_01"
	e.SetScope(lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target_01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"})
	e.LeaseID = "lease_01"
	e.SetFencingToken(42)
	e.RequestedTTLMS = 30000
	e.EffectiveTTLMS = 30000
	e.DeadlineClass = DeadlineClient
	e.PreviousState = ""
	e.ResultingState = lease.StateActive
	e.SetResult(lease.CodeAcquired)
	e.BackendHealth = lease.HealthOK
	return e
}

// denyEvent is a valid, normal-priority denied acquire (conflict).
func denyEvent(at time.Time) Event {
	e := acquireEvent(at)
	e.LeaseID, e.FencingToken = "", nil
	e.ResultingState = ""
	e.SetResult(lease.CodeConflict)
	return e
}

// revokeEvent is a valid, allowed, high-priority revoke.
func revokeEvent(at time.Time) Event {
	e := NewEvent(EventRevoke, at)
	e.RequestID, e.CorrelationID = "request_02", "corr_02"
	e.PrincipalClass, e.PrincipalID, e.CredentialID = PrincipalAdministrator, "prn_admin_01", "key_admin_01"
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
