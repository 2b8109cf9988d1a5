package leasetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
)

// invalidCase is one bad input at one entry point and the field it must name.
type invalidCase struct {
	name, field string
	call        func(e *env, w world) error
}

// invalid_request: bad input at every entry point is invalid_request with a
// field-level reason and changes nothing.
func (s *suite) invalidRequests(t *testing.T) {
	for _, g := range []struct {
		entry string
		cases []invalidCase
	}{
		{"acquire", invalidAcquires()},
		{"renew", invalidRenews()},
		{"release", invalidReleases()},
		{"force_release", invalidAdmins(lease.OpForceRelease)},
		{"revoke", invalidAdmins(lease.OpRevoke)},
		{"inspect", invalidInspects()},
		{"list", invalidLists()},
		{"history", invalidHistories()},
		{"authorize_commit", invalidCommits()},
		{"lookup_request", invalidLookups()},
	} {
		group(t, g.entry, func(t *testing.T) {
			for _, c := range g.cases {
				s.leaf(t, c.name, func(e *env) {
					w := e.newWorld()
					e.noEffect(w, func() { mustInvalid(e.t, c.call(e, w), c.field) })
				})
			}
		})
	}
}

func invalidAcquires() []invalidCase {
	c := func(name, field string, edit func(*lease.AcquireRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := e.acquireReqFor(w.free, e.owner)
			edit(&r)
			return errOf(e.st.Acquire(bg, r))
		}}
	}
	manyKeys := lease.Metadata{}
	for i := 0; i <= lease.MaxMetadataKeys; i++ {
		manyKeys[fmt.Sprintf("k%d", i)] = "v"
	}
	return []invalidCase{
		c("lock_identity", "lock_identity.target_id", func(r *lease.AcquireRequest) { r.Identity.TargetID = "a/b" }),
		c("request_id", "request_id", func(r *lease.AcquireRequest) { r.RequestID = "" }),
		c("request_id_malformed", "request_id", func(r *lease.AcquireRequest) { r.RequestID = "req 1" }),
		c("owner_principal_id", "owner_principal_id", func(r *lease.AcquireRequest) { r.Caller.PrincipalID = "" }),
		c("owner_client_id", "owner_client_id", func(r *lease.AcquireRequest) { r.Caller.ClientID = "" }),
		c("owner_credential_id", "owner_credential_id", func(r *lease.AcquireRequest) { r.Caller.CredentialID = "key/1" }),
		c("service_instance_id", "service_instance_id", func(r *lease.AcquireRequest) { r.ServiceInstanceID = "" }),
		c("execution_id", "execution_id", func(r *lease.AcquireRequest) { r.ExecutionID = "" }),
		c("job_id", "job_id", func(r *lease.AcquireRequest) { r.JobID = "job\n1" }),
		c("trace_id", "trace_id", func(r *lease.AcquireRequest) { r.TraceID = "trace 1" }),
		c("ttl_ms_zero", "ttl_ms", func(r *lease.AcquireRequest) { r.TTL = 0 }),
		c("ttl_ms_negative", "ttl_ms", func(r *lease.AcquireRequest) { r.TTL = -time.Second }),
		c("ttl_ms_sub_millisecond", "ttl_ms", func(r *lease.AcquireRequest) { r.TTL = 1500 * time.Microsecond }),
		c("ttl_ms_above_server_maximum", "ttl_ms", func(r *lease.AcquireRequest) {
			r.TTL, r.MaximumLifetime = lease.MaxTTL+time.Second, lease.MaxLifetime
		}),
		c("ttl_ms_above_maximum_lifetime", "ttl_ms", func(r *lease.AcquireRequest) { r.TTL, r.MaximumLifetime = 10*time.Second, 5*time.Second }),
		c("maximum_lifetime_ms_zero", "maximum_lifetime_ms", func(r *lease.AcquireRequest) { r.MaximumLifetime = 0 }),
		c("maximum_lifetime_ms_above_server_maximum", "maximum_lifetime_ms", func(r *lease.AcquireRequest) {
			r.MaximumLifetime = lease.MaxLifetime + time.Hour
		}),
		c("metadata_nested_value", "metadata", func(r *lease.AcquireRequest) { r.Metadata = lease.Metadata{"a": map[string]any{"b": 1}} }),
		c("metadata_too_many_keys", "metadata", func(r *lease.AcquireRequest) { r.Metadata = manyKeys }),
		c("metadata_bad_key", "metadata", func(r *lease.AcquireRequest) { r.Metadata = lease.Metadata{"Bad Key": "x"} }),
		c("metadata_too_large", "metadata", func(r *lease.AcquireRequest) {
			r.Metadata = lease.Metadata{"blob": strings.Repeat("x", lease.MaxMetadataBytes)}
		}),
	}
}

func invalidRenews() []invalidCase {
	c := func(name, field string, edit func(*lease.RenewRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := e.renewReq(w.rec)
			edit(&r)
			return errOf(e.st.Renew(bg, r))
		}}
	}
	return []invalidCase{
		c("lock_identity", "lock_identity.tenant_id", func(r *lease.RenewRequest) { r.Identity.TenantID = "" }),
		c("request_id", "request_id", func(r *lease.RenewRequest) { r.RequestID = "" }),
		c("owner_principal_id", "owner_principal_id", func(r *lease.RenewRequest) { r.Caller.PrincipalID = "" }),
		c("lease_id", "lease_id", func(r *lease.RenewRequest) { r.LeaseID = "" }),
		c("lease_id_malformed", "lease_id", func(r *lease.RenewRequest) { r.LeaseID = "lease 1" }),
		c("fencing_token_zero", "fencing_token", func(r *lease.RenewRequest) { r.FencingToken = 0 }),
		c("fencing_token_above_maximum", "fencing_token", func(r *lease.RenewRequest) { r.FencingToken = lease.MaxFencingToken + 1 }),
		c("service_instance_id", "service_instance_id", func(r *lease.RenewRequest) { r.ServiceInstanceID = "" }),
		c("ttl_ms_negative", "ttl_ms", func(r *lease.RenewRequest) { r.TTL = -time.Second }),
		c("ttl_ms_above_server_maximum", "ttl_ms", func(r *lease.RenewRequest) { r.TTL = lease.MaxTTL + time.Second }),
	}
}

func invalidReleases() []invalidCase {
	c := func(name, field string, edit func(*lease.ReleaseRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := e.releaseReq(w.rec)
			edit(&r)
			return errOf(e.st.Release(bg, r))
		}}
	}
	return []invalidCase{
		c("lock_identity", "lock_identity.actor_name", func(r *lease.ReleaseRequest) { r.Identity.ActorName = "a b" }),
		c("request_id", "request_id", func(r *lease.ReleaseRequest) { r.RequestID = "" }),
		c("owner_principal_id", "owner_principal_id", func(r *lease.ReleaseRequest) { r.Caller.PrincipalID = "" }),
		c("lease_id", "lease_id", func(r *lease.ReleaseRequest) { r.LeaseID = "" }),
		c("fencing_token_zero", "fencing_token", func(r *lease.ReleaseRequest) { r.FencingToken = 0 }),
		c("service_instance_id", "service_instance_id", func(r *lease.ReleaseRequest) { r.ServiceInstanceID = "../x" }),
	}
}

func invalidAdmins(op lease.Op) []invalidCase {
	c := func(name, field string, edit func(*lease.AdminRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := e.adminReq(w.rec)
			edit(&r)
			return errOf(e.adminOp(op, r))
		}}
	}
	cases := []invalidCase{
		c("reason_and_incident_id_missing", "reason", func(r *lease.AdminRequest) { r.Reason, r.IncidentID = "", "" }),
		c("incident_id_malformed", "incident_id", func(r *lease.AdminRequest) { r.Reason, r.IncidentID = "", "inc 1" }),
		c("lease_id", "lease_id", func(r *lease.AdminRequest) { r.LeaseID = "lease/1" }),
		c("fencing_token_zero", "fencing_token", func(r *lease.AdminRequest) { r.FencingToken = 0 }),
		c("request_id", "request_id", func(r *lease.AdminRequest) { r.RequestID = "" }),
	}
	if op == lease.OpForceRelease {
		cases = append(cases,
			c("reason_control_character", "reason", func(r *lease.AdminRequest) { r.Reason = "drained\x07" }),
			c("reason_too_long", "reason", func(r *lease.AdminRequest) { r.Reason = strings.Repeat("r", lease.MaxReasonBytes+1) }),
			c("reason_blank", "reason", func(r *lease.AdminRequest) { r.Reason = "   " }),
			c("lock_identity", "lock_identity.target_namespace", func(r *lease.AdminRequest) { r.Identity.TargetNamespace = "ns*" }),
			c("admin_principal_id", "owner_principal_id", func(r *lease.AdminRequest) { r.Caller.PrincipalID = "" }),
		)
	}
	return cases
}

func invalidInspects() []invalidCase {
	c := func(name, field string, edit func(e *env, w world, r *lease.InspectRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := lease.InspectRequest{DeadlineAt: deadline(), Caller: e.owner}
			edit(e, w, &r)
			return errOf(e.st.Inspect(bg, r))
		}}
	}
	return []invalidCase{
		c("neither_identity_nor_lease_id", "lock_identity", func(*env, world, *lease.InspectRequest) {}),
		c("both_identity_and_lease_id", "lease_id", func(e *env, w world, r *lease.InspectRequest) {
			r.Identity, r.LeaseID = e.id, w.rec.LeaseID
		}),
		c("lease_id_malformed", "lease_id", func(e *env, w world, r *lease.InspectRequest) { r.LeaseID = w.rec.LeaseID + "*" }),
		c("lock_identity", "lock_identity.target_id", func(e *env, w world, r *lease.InspectRequest) {
			r.Identity = e.id
			r.Identity.TargetID += "?"
		}),
	}
}

func invalidLists() []invalidCase {
	c := func(name, field string, edit func(e *env, r *lease.ListRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := byProgram(e.id)
			r.DeadlineAt, r.Caller = deadline(), e.owner
			edit(e, &r)
			_, err := e.st.List(bg, r)
			return err
		}}
	}
	return []invalidCase{
		c("by", "by", func(e *env, r *lease.ListRequest) { r.By = "everything" }),
		c("page_size_above_maximum", "page_size", func(e *env, r *lease.ListRequest) { r.PageSize = StoreOptions().MaxPageSize + 1 }),
		c("page_size_negative", "page_size", func(e *env, r *lease.ListRequest) { r.PageSize = -1 }),
		c("page_token_malformed", "page_token", func(e *env, r *lease.ListRequest) { r.PageToken = "not-a-token" }),
		c("owner_with_target_fields", "owner_principal_id", func(e *env, r *lease.ListRequest) {
			r.By, r.OwnerPrincipalID = lease.ListByOwner, e.owner.PrincipalID
		}),
		c("owner_missing", "owner_principal_id", func(e *env, r *lease.ListRequest) {
			*r = lease.ListRequest{By: lease.ListByOwner, DeadlineAt: deadline()}
		}),
		c("program_with_target_fields", "target_id", func(e *env, r *lease.ListRequest) { r.TargetID = e.id.TargetID }),
		c("target_with_owner", "owner_principal_id", func(e *env, r *lease.ListRequest) {
			r.By, r.TargetNamespace, r.TargetID, r.OwnerPrincipalID = lease.ListByTarget, e.id.TargetNamespace, e.id.TargetID, e.owner.PrincipalID
		}),
		c("target_missing", "target_id", func(e *env, r *lease.ListRequest) {
			r.By, r.TargetNamespace = lease.ListByTarget, e.id.TargetNamespace
		}),
		c("tenant_pattern", "tenant_id", func(e *env, r *lease.ListRequest) { r.TenantID = "*" }),
	}
}

func invalidHistories() []invalidCase {
	c := func(name, field string, edit func(e *env, r *lease.HistoryRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := lease.HistoryRequest{Identity: e.id, DeadlineAt: deadline(), Caller: e.admin}
			edit(e, &r)
			_, err := e.st.History(bg, r)
			return err
		}}
	}
	return []invalidCase{
		c("lock_identity", "lock_identity.program_id", func(e *env, r *lease.HistoryRequest) { r.Identity.ProgramID = "" }),
		c("page_size_above_maximum", "page_size", func(e *env, r *lease.HistoryRequest) { r.PageSize = StoreOptions().MaxPageSize + 1 }),
		c("page_size_negative", "page_size", func(e *env, r *lease.HistoryRequest) { r.PageSize = -5 }),
		c("page_token_malformed", "page_token", func(e *env, r *lease.HistoryRequest) { r.PageToken = "%%%" }),
	}
}

func invalidCommits() []invalidCase {
	c := func(name, field string, edit func(*lease.CommitRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := e.commitReq(w.rec, "couchdb")
			edit(&r)
			_, err := e.st.AuthorizeCommit(bg, r)
			return err
		}}
	}
	return []invalidCase{
		c("lock_identity", "lock_identity.workflow_name", func(r *lease.CommitRequest) { r.Identity.WorkflowName = "wf/x" }),
		c("owner_principal_id", "owner_principal_id", func(r *lease.CommitRequest) { r.Caller.PrincipalID = "" }),
		c("lease_id", "lease_id", func(r *lease.CommitRequest) { r.LeaseID = "" }),
		c("fencing_token_zero", "fencing_token", func(r *lease.CommitRequest) { r.FencingToken = 0 }),
		c("service_instance_id", "service_instance_id", func(r *lease.CommitRequest) { r.ServiceInstanceID = "" }),
		c("sink_empty", "sink", func(r *lease.CommitRequest) { r.Sink = "" }),
		c("sink_pattern", "sink", func(r *lease.CommitRequest) { r.Sink = "couch*" }),
		c("commit_id", "commit_id", func(r *lease.CommitRequest) { r.CommitID = "" }),
		c("execution_id", "execution_id", func(r *lease.CommitRequest) { r.ExecutionID = "" }),
		c("trace_id", "trace_id", func(r *lease.CommitRequest) { r.TraceID = "trace\x00" }),
	}
}

func invalidLookups() []invalidCase {
	c := func(name, field string, edit func(*lease.LookupRequest)) invalidCase {
		return invalidCase{name, field, func(e *env, w world) error {
			r := lease.LookupRequest{Op: lease.OpAcquire, Identity: e.id, PrincipalID: w.rec.OwnerPrincipalID,
				RequestID: w.rec.RequestID, DeadlineAt: deadline()}
			edit(&r)
			return errOf(e.st.LookupRequest(bg, r))
		}}
	}
	return []invalidCase{
		c("operation", "operation", func(r *lease.LookupRequest) { r.Op = "steal" }),
		c("lock_identity", "lock_identity.operation_class", func(r *lease.LookupRequest) { r.Identity.OperationClass = "bogus" }),
		c("owner_principal_id", "owner_principal_id", func(r *lease.LookupRequest) { r.PrincipalID = "" }),
		c("request_id", "request_id", func(r *lease.LookupRequest) { r.RequestID = "" }),
	}
}
