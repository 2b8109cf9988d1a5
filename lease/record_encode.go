package lease

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// The appenders below write exactly the bytes encoding/json writes for
// Record, HistoryEntry and IdempotencyRecord (the stored formats), without
// reflection: every mutation encodes two or three of them inside its
// backend transaction, where reflection was most of the time spent.
// TestCanonicalEncoderMatchesJSON checks them against json.Marshal, and
// metadata and any string that needs escaping still go through
// encoding/json, so its escaping rules stay the one definition.

func appendRecord(b []byte, r *Record) ([]byte, error) {
	b = append(b, `{"record_version":`...)
	b = strconv.AppendInt(b, int64(r.RecordVersion), 10)
	b = appendStringField(b, `,"lock_key":`, r.LockKey)
	b = appendStringField(b, `,"tenant_id":`, r.TenantID)
	b = appendStringField(b, `,"program_id":`, r.ProgramID)
	b = appendStringField(b, `,"target_namespace":`, r.TargetNamespace)
	b = appendStringField(b, `,"target_id":`, r.TargetID)
	b = appendStringField(b, `,"actor_name":`, r.ActorName)
	b = appendStringField(b, `,"workflow_name":`, r.WorkflowName)
	b = appendStringField(b, `,"operation_class":`, r.OperationClass)
	b = appendStringField(b, `,"lease_id":`, r.LeaseID)
	b = appendStringField(b, `,"owner_principal_id":`, r.OwnerPrincipalID)
	b = appendStringField(b, `,"owner_client_id":`, r.OwnerClientID)
	b = appendStringField(b, `,"owner_credential_id":`, r.OwnerCredentialID)
	b = appendStringField(b, `,"service_instance_id":`, r.ServiceInstanceID)
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendUint(b, r.FencingToken, 10)
	var err error
	if b, err = appendTimestampField(b, `,"acquired_at":`, r.AcquiredAt); err != nil {
		return nil, err
	}
	if b, err = appendTimestampField(b, `,"renewed_at":`, r.RenewedAt); err != nil {
		return nil, err
	}
	if b, err = appendTimestampField(b, `,"expires_at":`, r.ExpiresAt); err != nil {
		return nil, err
	}
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, r.TTLMs, 10)
	b = append(b, `,"maximum_lifetime_ms":`...)
	b = strconv.AppendInt(b, r.MaximumLifetimeMs, 10)
	b = appendStringField(b, `,"execution_id":`, r.ExecutionID)
	b = appendStringField(b, `,"job_id":`, r.JobID)
	b = appendStringField(b, `,"trace_id":`, r.TraceID)
	b = appendStringField(b, `,"request_id":`, r.RequestID)
	b = append(b, `,"metadata":`...)
	if len(r.Metadata) == 0 {
		b = append(b, `{}`...)
	} else {
		m, err := r.Metadata.MarshalJSON()
		if err != nil {
			return nil, err
		}
		// encoding/json compacts a Marshaler's output; Marshal's is compact.
		b = append(b, m...)
	}
	b = appendStringField(b, `,"state":`, string(r.State))
	return append(b, '}'), nil
}

func appendHistoryEntry(b []byte, h *HistoryEntry) ([]byte, error) {
	b = append(b, `{"history_version":`...)
	b = strconv.AppendInt(b, int64(h.HistoryVersion), 10)
	b = append(b, `,"record":`...)
	b, err := appendRecordOrNull(b, h.Record)
	if err != nil {
		return nil, err
	}
	if b, err = appendTimestampField(b, `,"ended_at":`, h.EndedAt); err != nil {
		return nil, err
	}
	for _, f := range [...]struct{ name, v string }{{`,"ended_by":`, h.EndedBy}, {`,"request_id":`, h.RequestID},
		{`,"reason":`, h.Reason}, {`,"incident_id":`, h.IncidentID}} {
		if f.v != "" { // omitempty
			b = appendStringField(b, f.name, f.v)
		}
	}
	return append(b, '}'), nil
}

func appendIdempotencyRecord(b []byte, e *IdempotencyRecord) ([]byte, error) {
	b = append(b, `{"idempotency_version":`...)
	b = strconv.AppendInt(b, int64(e.Version), 10)
	b = appendStringField(b, `,"op":`, string(e.Op))
	b = appendStringField(b, `,"digest":`, e.Digest)
	b = appendStringField(b, `,"code":`, string(e.Code))
	b = append(b, `,"lease":`...)
	b, err := appendRecordOrNull(b, e.Lease)
	if err != nil {
		return nil, err
	}
	if b, err = appendTimestampField(b, `,"backend_time":`, e.BackendTime); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

func appendRecordOrNull(b []byte, r *Record) ([]byte, error) {
	if r == nil {
		return append(b, "null"...), nil
	}
	return appendRecord(b, r)
}

func appendTimestampField(b []byte, name string, ts Timestamp) ([]byte, error) {
	if ts.t.IsZero() {
		_, err := ts.MarshalJSON()
		return nil, err
	}
	b = append(b, name...)
	b = append(b, '"')
	b = appendTimestamp(b, ts.t)
	return append(b, '"'), nil
}

func appendStringField(b []byte, name, v string) []byte {
	b = append(b, name...)
	if plainJSON(v) {
		b = append(b, '"')
		b = append(b, v...)
		return append(b, '"')
	}
	q, _ := json.Marshal(v) // a string always marshals
	return append(b, q...)
}

// plainJSON reports whether encoding/json writes v between quotes as is:
// printable ASCII without the characters it escapes (" \ and, for HTML
// safety, < > &). Anything else is left to encoding/json.
func plainJSON(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
