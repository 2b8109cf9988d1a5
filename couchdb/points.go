package couchdb

import (
	"context"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// The typed helpers below are the StarIntel enforcement points, each a thin
// fence.Sink over a Writer with its document shape and its document id:
//
//	point 1  TargetStates  "target:<identity>"           target acceptance and state
//	point 2  Results       "result:<identity>~<name>"    results of exclusive execution
//	point 4  Schedules     "schedule:<identity>"         scheduler completion/reschedule
//	point 5  Jobs          "job:<identity>~<job_id>"     job checkpoint and terminal state
//
// <identity> is the canonical (normalized) lock identity, its seven
// components joined by "~", a character no component may contain (":" may
// appear inside a component, so it cannot separate them). Ids are built
// only from canonical values, never from raw input. A job id (an opaque
// id, lease.CheckOpaqueID) cannot contain "~" either, so an id names
// exactly one identity and job. A result or job id whose components are
// all near their 256-byte limit can exceed MaxDocIDBytes; such a write is
// refused (invalid_lease_request) before anything is authorized or sent.
//
// A job document's id carries the identity because a lease's job_id is
// whatever its acquirer sent: with id "job:<job_id>" a lease of another
// tenant (or program, or target) that claimed the victim's job id could
// create the victim's job document first and bind it to its own lock key.
// Job documents of the old form "job:<job_id>" are neither read nor
// written by Jobs, and validate_doc_update refuses every write of one
// (creation included): they stay in the database, frozen, until an
// administrator removes them.
//
// Every helper first checks that the commit's guard belongs to the
// identity the document is about (the guard's lock key is the canonical
// lock key of the payload's identity; invalid_lease_request otherwise), so a
// holder cannot write another identity's document with its own guard; the
// database's fence then binds each document to the first lock key that
// wrote it.
//
// Call sites:
//
//	states := couchdb.NewTargetStates(writer)
//	_, err := fence.Write(ctx, l.Committer(), states, commitID,
//		couchdb.TargetState{Identity: spec.Identity, Status: couchdb.TargetAccepted})

// Document types, stored in each document's "type" member.
const (
	TypeTargetState = "starintel.target_state"
	TypeResult      = "starintel.result"
	TypeSchedule    = "starintel.schedule"
	TypeJob         = "starintel.job"
)

// Target statuses (any canonical identifier is accepted).
const (
	TargetAccepted  = "accepted"
	TargetRunning   = "running"
	TargetCompleted = "completed"
	TargetFailed    = "failed"
)

// Schedule statuses.
const (
	ScheduleCompleted   = "completed"
	ScheduleRescheduled = "rescheduled"
)

// Job statuses: JobRunning is a checkpoint; the others are terminal.
const (
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
	JobCancelled = "cancelled"
)

// MaxReasonBytes bounds the free-text reason of a state document.
const MaxReasonBytes = 1024

// TargetState is the acceptance and state of a target under one lock
// identity (enforcement point 1).
type TargetState struct {
	Identity lease.Identity `json:"lock_identity"`
	// Status is a canonical identifier (TargetAccepted, TargetRunning, …).
	Status string `json:"status"`
	// Reason is an optional bounded human-readable note.
	Reason string `json:"reason,omitempty"`
	// Data is optional JSON describing the state.
	Data json.RawMessage `json:"data,omitempty"`
}

// Result is a result document of exclusive target execution (enforcement
// point 2): one document per identity and result name, so a successor's
// result supersedes its predecessor's and a stale holder's is refused.
type Result struct {
	Identity lease.Identity `json:"lock_identity"`
	// Name is a canonical identifier naming the result ("ports", "dns").
	Name        string          `json:"name"`
	ContentType string          `json:"content_type,omitempty"`
	Data        json.RawMessage `json:"data"`
}

// ScheduleState is the scheduler's completion or reschedule state of one
// lock identity (enforcement point 4).
type ScheduleState struct {
	Identity lease.Identity `json:"lock_identity"`
	// Status is ScheduleCompleted or ScheduleRescheduled.
	Status      string           `json:"status"`
	CompletedAt *lease.Timestamp `json:"completed_at,omitempty"`
	// NextRunAt is required when Status is ScheduleRescheduled.
	NextRunAt *lease.Timestamp `json:"next_run_at,omitempty"`
	Attempt   int              `json:"attempt,omitempty"`
	Reason    string           `json:"reason,omitempty"`
}

// JobState is a job's checkpoint (Status JobRunning) or terminal state
// (enforcement point 5).
type JobState struct {
	// JobID is the job's opaque id (the lease's job_id).
	JobID    string         `json:"job_id"`
	Identity lease.Identity `json:"lock_identity"`
	Status   string         `json:"status"`
	// Terminal is set by Jobs.Commit from Status.
	Terminal   bool            `json:"terminal"`
	Checkpoint json.RawMessage `json:"checkpoint,omitempty"`
	Reason     string          `json:"reason,omitempty"`
}

// identityPart is the id component of a canonical identity.
func identityPart(id lease.Identity) string {
	return strings.Join([]string{id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID,
		id.ActorName, id.WorkflowName, id.OperationClass}, "~")
}

// canonical normalizes id and returns it with its lock key.
func (db *DB) canonical(id lease.Identity) (lease.Identity, string, error) {
	return lease.CanonicalLockKey(id, db.classes)
}

// TargetStateID is the document id of a target state.
func (db *DB) TargetStateID(id lease.Identity) (string, error) {
	c, _, err := db.canonical(id)
	if err != nil {
		return "", err
	}
	return "target:" + identityPart(c), nil
}

// ResultID is the document id of a result.
func (db *DB) ResultID(id lease.Identity, name string) (string, error) {
	c, _, err := db.canonical(id)
	if err != nil {
		return "", err
	}
	n, err := canonicalName("name", name)
	if err != nil {
		return "", err
	}
	return "result:" + identityPart(c) + "~" + n, nil
}

// ScheduleID is the document id of a schedule state.
func (db *DB) ScheduleID(id lease.Identity) (string, error) {
	c, _, err := db.canonical(id)
	if err != nil {
		return "", err
	}
	return "schedule:" + identityPart(c), nil
}

// JobDocID is the document id of the state of job jobID under identity
// id: "job:<identity>~<job_id>". A job's state is bound to the identity
// whose lease wrote it, so the same job id under another identity names
// another document.
func (db *DB) JobDocID(id lease.Identity, jobID string) (string, error) {
	c, _, err := db.canonical(id)
	if err != nil {
		return "", err
	}
	return jobDocID(c, jobID)
}

// jobDocID is the document id of job jobID under canonical identity c.
func jobDocID(c lease.Identity, jobID string) (string, error) {
	if err := lease.CheckOpaqueID("job_id", jobID); err != nil {
		return "", err
	}
	return "job:" + identityPart(c) + "~" + jobID, nil
}

// canonicalName requires v to be a canonical identifier already.
func canonicalName(field, v string) (string, error) {
	n, err := lease.NormalizeIdentifier(field, v)
	if err != nil {
		return "", err
	}
	if n != v {
		return "", lease.Invalid(field, "must be canonical (lower case, normalized)")
	}
	return n, nil
}

func checkReason(r string) error {
	if len(r) > MaxReasonBytes || !utf8.ValidString(r) {
		return lease.Invalid("reason", "must be valid UTF-8 of at most 1024 bytes")
	}
	return nil
}

// typedWrite is the document a typed payload becomes and the lock key of
// the identity it is about.
type typedWrite struct {
	lockKey string
	doc     Doc
}

// typed encodes a typed payload as its document. Bind and Commit of every
// helper share it, so the write a guard is authorized for is the write
// made.
func typed(db *DB, id lease.Identity, docID func(lease.Identity) (string, error),
	typ string, payload func(canonical lease.Identity) (any, error)) (typedWrite, error) {
	const op = "commit"
	c, key, err := db.canonical(id)
	if err != nil {
		return typedWrite{}, wrapLease(ErrInvalid, op, "", lease.AsError(err))
	}
	did, err := docID(c)
	if err != nil {
		return typedWrite{}, wrapLease(ErrInvalid, op, "", lease.AsError(err))
	}
	v, err := payload(c)
	if err != nil {
		return typedWrite{}, wrapLease(ErrInvalid, op, did, lease.AsError(err))
	}
	body, err := typedBody(typ, v)
	if err != nil {
		return typedWrite{}, wrapLease(ErrInvalid, op, did, lease.AsError(err))
	}
	return typedWrite{lockKey: key, doc: Doc{ID: did, Body: body}}, nil
}

// bindTyped is Bind of a typed write.
func (w *Writer) bindTyped(t typedWrite, err error) (fence.Binding, error) {
	if err != nil {
		return fence.Binding{}, err
	}
	return w.bind(t.doc)
}

// commitTyped is the common path of the helpers' Commit: the guard must
// belong to the identity the document is about, then the write is the
// Writer's.
func (w *Writer) commitTyped(ctx context.Context, g fence.Guard, t typedWrite) error {
	if g.LockKey != t.lockKey {
		return wrapLease(ErrInvalid, "commit", "", lease.Invalid("lock_identity", "the guard belongs to another lock identity"))
	}
	return w.commit(ctx, g, t.doc)
}

// typedBody encodes v with a "type" member.
func typedBody(typ string, v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, lease.Invalid("body", "cannot be encoded as JSON")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, lease.Invalid("body", "must encode as a JSON object")
	}
	m["type"], _ = json.Marshal(typ)
	return json.Marshal(m)
}

// getTyped reads a typed document into v and returns its fence.
func getTyped(ctx context.Context, db *DB, docID, typ string, v any) (*fence.Guard, error) {
	s, err := db.Get(ctx, docID)
	if err != nil {
		return nil, err
	}
	var t struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(s.Body, &t) != nil || t.Type != typ {
		return nil, newError(ErrCorrupt, "get", docID, "the document is not of type "+typ)
	}
	if err := json.Unmarshal(s.Body, v); err != nil {
		return nil, newError(ErrCorrupt, "get", docID, "the document does not decode as "+typ)
	}
	return s.Fence, nil
}

// checkData requires an optional JSON value to be valid.
func checkData(field string, d json.RawMessage, required bool) error {
	if len(d) == 0 {
		if required {
			return lease.Invalid(field, "is required")
		}
		return nil
	}
	if !json.Valid(d) {
		return lease.Invalid(field, "must be valid JSON")
	}
	return nil
}

// TargetStates writes target acceptance and state documents (point 1).
type TargetStates struct{ w *Writer }

// NewTargetStates returns the target-state sink over w.
func NewTargetStates(w *Writer) *TargetStates { return &TargetStates{w: w} }

// Name returns the sink name.
func (s *TargetStates) Name() string { return s.w.name }

// Bind names the write of st (see Writer.Bind).
func (s *TargetStates) Bind(st TargetState) (fence.Binding, error) { return s.w.bindTyped(s.write(st)) }

// Commit writes st conditioned on g (see Writer.Commit).
func (s *TargetStates) Commit(ctx context.Context, g fence.Guard, st TargetState) error {
	t, err := s.write(st)
	if err != nil {
		return err
	}
	return s.w.commitTyped(ctx, g, t)
}

func (s *TargetStates) write(st TargetState) (typedWrite, error) {
	return typed(s.w.db, st.Identity, func(c lease.Identity) (string, error) {
		return "target:" + identityPart(c), nil
	}, TypeTargetState, func(c lease.Identity) (any, error) {
		st.Identity = c
		if _, err := canonicalName("status", st.Status); err != nil {
			return nil, err
		}
		if err := checkReason(st.Reason); err != nil {
			return nil, err
		}
		return st, checkData("data", st.Data, false)
	})
}

// Get reads the target state of id and the fence of its last write.
func (s *TargetStates) Get(ctx context.Context, id lease.Identity) (TargetState, *fence.Guard, error) {
	did, err := s.w.db.TargetStateID(id)
	if err != nil {
		return TargetState{}, nil, wrapLease(ErrInvalid, "get", "", lease.AsError(err))
	}
	var st TargetState
	g, err := getTyped(ctx, s.w.db, did, TypeTargetState, &st)
	return st, g, err
}

// Results writes result documents of exclusive execution (point 2).
type Results struct{ w *Writer }

// NewResults returns the result sink over w.
func NewResults(w *Writer) *Results { return &Results{w: w} }

// Name returns the sink name.
func (s *Results) Name() string { return s.w.name }

// Bind names the write of r (see Writer.Bind).
func (s *Results) Bind(r Result) (fence.Binding, error) { return s.w.bindTyped(s.write(r)) }

// Commit writes r conditioned on g (see Writer.Commit).
func (s *Results) Commit(ctx context.Context, g fence.Guard, r Result) error {
	t, err := s.write(r)
	if err != nil {
		return err
	}
	return s.w.commitTyped(ctx, g, t)
}

func (s *Results) write(r Result) (typedWrite, error) {
	return typed(s.w.db, r.Identity, func(c lease.Identity) (string, error) {
		n, err := canonicalName("name", r.Name)
		if err != nil {
			return "", err
		}
		return "result:" + identityPart(c) + "~" + n, nil
	}, TypeResult, func(c lease.Identity) (any, error) {
		r.Identity = c
		if len(r.ContentType) > 255 || !utf8.ValidString(r.ContentType) {
			return nil, lease.Invalid("content_type", "must be at most 255 bytes of UTF-8")
		}
		return r, checkData("data", r.Data, true)
	})
}

// Get reads the result name of id and the fence of its last write.
func (s *Results) Get(ctx context.Context, id lease.Identity, name string) (Result, *fence.Guard, error) {
	did, err := s.w.db.ResultID(id, name)
	if err != nil {
		return Result{}, nil, wrapLease(ErrInvalid, "get", "", lease.AsError(err))
	}
	var r Result
	g, err := getTyped(ctx, s.w.db, did, TypeResult, &r)
	return r, g, err
}

// Schedules writes scheduler completion/reschedule state (point 4).
type Schedules struct{ w *Writer }

// NewSchedules returns the schedule sink over w.
func NewSchedules(w *Writer) *Schedules { return &Schedules{w: w} }

// Name returns the sink name.
func (s *Schedules) Name() string { return s.w.name }

// Bind names the write of st (see Writer.Bind).
func (s *Schedules) Bind(st ScheduleState) (fence.Binding, error) { return s.w.bindTyped(s.write(st)) }

// Commit writes st conditioned on g (see Writer.Commit).
func (s *Schedules) Commit(ctx context.Context, g fence.Guard, st ScheduleState) error {
	t, err := s.write(st)
	if err != nil {
		return err
	}
	return s.w.commitTyped(ctx, g, t)
}

func (s *Schedules) write(st ScheduleState) (typedWrite, error) {
	return typed(s.w.db, st.Identity, func(c lease.Identity) (string, error) {
		return "schedule:" + identityPart(c), nil
	}, TypeSchedule, func(c lease.Identity) (any, error) {
		st.Identity = c
		switch st.Status {
		case ScheduleCompleted:
		case ScheduleRescheduled:
			if st.NextRunAt == nil || st.NextRunAt.IsZero() {
				return nil, lease.Invalid("next_run_at", "is required to reschedule")
			}
		default:
			return nil, lease.Invalid("status", "must be completed or rescheduled")
		}
		if st.Attempt < 0 {
			return nil, lease.Invalid("attempt", "must not be negative")
		}
		if (st.CompletedAt != nil && st.CompletedAt.IsZero()) || (st.NextRunAt != nil && st.NextRunAt.IsZero()) {
			return nil, lease.Invalid("completed_at", "must not be the zero time")
		}
		return st, checkReason(st.Reason)
	})
}

// Get reads the schedule state of id and the fence of its last write.
func (s *Schedules) Get(ctx context.Context, id lease.Identity) (ScheduleState, *fence.Guard, error) {
	did, err := s.w.db.ScheduleID(id)
	if err != nil {
		return ScheduleState{}, nil, wrapLease(ErrInvalid, "get", "", lease.AsError(err))
	}
	var st ScheduleState
	g, err := getTyped(ctx, s.w.db, did, TypeSchedule, &st)
	return st, g, err
}

// Jobs writes job checkpoints and terminal states (point 5).
type Jobs struct{ w *Writer }

// NewJobs returns the job sink over w.
func NewJobs(w *Writer) *Jobs { return &Jobs{w: w} }

// Name returns the sink name.
func (s *Jobs) Name() string { return s.w.name }

// Bind names the write of st (see Writer.Bind).
func (s *Jobs) Bind(st JobState) (fence.Binding, error) { return s.w.bindTyped(s.write(st)) }

// Commit writes st conditioned on g (see Writer.Commit). The guard must
// have been issued for the lease of this very job (its job_id) and
// identity (its lock key): a holder cannot write the state of a job that
// is not its lease's, not even one whose document does not exist yet, and
// a lease of another identity that claims the same job id writes its own
// document (job:<its identity>~<job_id>), never this one.
// validate_doc_update refuses the same.
func (s *Jobs) Commit(ctx context.Context, g fence.Guard, st JobState) error {
	t, err := s.write(st)
	if err != nil {
		return err
	}
	if g.JobID != st.JobID {
		return newError(ErrFenceRejected, "commit", t.doc.ID, "the guard was issued for another job")
	}
	return s.w.commitTyped(ctx, g, t)
}

func (s *Jobs) write(st JobState) (typedWrite, error) {
	return typed(s.w.db, st.Identity, func(c lease.Identity) (string, error) {
		return jobDocID(c, st.JobID)
	}, TypeJob, func(c lease.Identity) (any, error) {
		st.Identity = c
		switch st.Status {
		case JobRunning:
			st.Terminal = false
		case JobSucceeded, JobFailed, JobCancelled:
			st.Terminal = true
		default:
			return nil, lease.Invalid("status", "must be running, succeeded, failed or cancelled")
		}
		if err := checkReason(st.Reason); err != nil {
			return nil, err
		}
		return st, checkData("checkpoint", st.Checkpoint, false)
	})
}

// Get reads the state of job jobID under identity id (the lock identity
// whose lease runs the job) and the fence of its last write.
func (s *Jobs) Get(ctx context.Context, id lease.Identity, jobID string) (JobState, *fence.Guard, error) {
	did, err := s.w.db.JobDocID(id, jobID)
	if err != nil {
		return JobState{}, nil, wrapLease(ErrInvalid, "get", "", lease.AsError(err))
	}
	var st JobState
	g, err := getTyped(ctx, s.w.db, did, TypeJob, &st)
	return st, g, err
}
