package lease

import (
	"context"
	"log/slog"
	"time"
)

// Store is the lease-store protocol. Every method is one atomic backend
// operation decided at backend time. Errors are always *Error; backend
// booleans, NIL replies and raw backend errors never cross this boundary.
//
// Every mutating request carries the identity, a request id, a finite
// deadline and the caller's safe security context; the owner of a new lease
// is the caller, never a body field. Every call, reads included, has a
// finite deadline: one that has passed at backend time when the operation
// would start returns deadline_exceeded. Reads report an active record past
// its expires_at in state expired.
type Store interface {
	// Acquire grants a new lease if no unexpired active lease exists.
	Acquire(ctx context.Context, req AcquireRequest) (Result, error)
	// Renew extends the exact matching active lease.
	Renew(ctx context.Context, req RenewRequest) (Result, error)
	// Release ends the exact matching active lease (compare-and-delete).
	Release(ctx context.Context, req ReleaseRequest) (Result, error)
	// ForceRelease ends the observed active lease for an administrator.
	ForceRelease(ctx context.Context, req AdminRequest) (Result, error)
	// Revoke ends the observed active lease with the security terminal state.
	Revoke(ctx context.Context, req AdminRequest) (Result, error)
	// Inspect reads the lease of an identity, or a lease by its id.
	Inspect(ctx context.Context, req InspectRequest) (Result, error)
	// List pages through unexpired active leases by a canonical filter.
	List(ctx context.Context, req ListRequest) (ListResult, error)
	// History pages through an identity's terminal records, newest first.
	History(ctx context.Context, req HistoryRequest) (HistoryResult, error)
	// AuthorizeCommit is the fenced-write validation at the backend
	// linearization point.
	AuthorizeCommit(ctx context.Context, req CommitRequest) (CommitResult, error)
	// LookupRequest returns the stored result of a mutation by request id,
	// resolving an outcome_unknown.
	LookupRequest(ctx context.Context, req LookupRequest) (Result, error)
	// Health reports whether the backend can give safe answers.
	Health(ctx context.Context) Health
	// Close releases resources; later calls return backend_unavailable.
	Close() error
}

// Op names a mutating operation; it scopes idempotency keys.
type Op string

const (
	OpAcquire      Op = "acquire"
	OpRenew        Op = "renew"
	OpRelease      Op = "release"
	OpForceRelease Op = "force_release"
	OpRevoke       Op = "revoke"
)

// Valid reports whether o is a known mutation.
func (o Op) Valid() bool { return o.SuccessCode() != "" }

// SuccessCode is the code of o's success: the only code its idempotency
// evidence holds. "" for an unknown operation.
func (o Op) SuccessCode() Code {
	switch o {
	case OpAcquire:
		return CodeAcquired
	case OpRenew:
		return CodeRenewed
	case OpRelease:
		return CodeReleased
	case OpForceRelease:
		return CodeForceReleased
	case OpRevoke:
		return CodeRevoked
	}
	return ""
}

// Caller is the authenticated, non-secret security context of a request.
type Caller struct {
	PrincipalID    string
	PrincipalClass string
	ClientID       string
	CredentialID   string
	// CorrelationID ties the request to its audit event.
	CorrelationID string
}

// Mutation is what every mutating request carries besides its own fields.
type Mutation struct {
	RequestID  string
	DeadlineAt time.Time
	Caller     Caller
}

// AcquireRequest asks for a new lease. TTL is the effective TTL already chosen
// by server policy; MaximumLifetime the configured maximum lifetime.
type AcquireRequest struct {
	Identity          Identity
	ServiceInstanceID string
	TTL               time.Duration
	MaximumLifetime   time.Duration
	ExecutionID       string
	JobID             string
	TraceID           string
	Metadata          Metadata
	Mutation
}

// RenewRequest extends a lease. TTL zero keeps the lease's current ttl_ms;
// otherwise ttl_ms becomes TTL, the effective TTL of the renewal.
type RenewRequest struct {
	Identity          Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	TTL               time.Duration
	Mutation
}

// ReleaseRequest ends a lease held by the caller.
type ReleaseRequest struct {
	Identity          Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	Mutation
}

// AdminRequest force-releases or revokes the observed lease (LeaseID and
// FencingToken as the administrator saw them). Reason or IncidentID is
// required.
type AdminRequest struct {
	Identity     Identity
	LeaseID      string
	FencingToken uint64
	Reason       string
	IncidentID   string
	Mutation
}

// InspectRequest names exactly one of an identity or a lease id.
type InspectRequest struct {
	Identity   Identity
	LeaseID    string
	DeadlineAt time.Time
	Caller     Caller
}

// ListBy selects a List filter.
type ListBy string

const (
	ListByOwner   ListBy = "owner"
	ListByTarget  ListBy = "target"
	ListByProgram ListBy = "program"
)

// ListRequest lists unexpired active leases by one canonical filter: by owner
// (OwnerPrincipalID), by target (tenant, program, namespace, target) or by
// program (tenant, program). Order is stable (by lease id, which sorts by
// acquisition time); PageToken is opaque and bound to the filter. This
// cursor is the store's, for its caller: package service seals it before a
// client sees it, bound to that client's authority.
type ListRequest struct {
	By               ListBy
	OwnerPrincipalID string
	TenantID         string
	ProgramID        string
	TargetNamespace  string
	TargetID         string
	PageSize         int
	PageToken        string
	DeadlineAt       time.Time
	Caller           Caller
}

// HistoryRequest pages through an identity's terminal records, newest first.
type HistoryRequest struct {
	Identity   Identity
	PageSize   int
	PageToken  string
	DeadlineAt time.Time
	Caller     Caller
}

// CommitRequest asks whether one write to Sink may linearize now under the
// exact lease. The caller is the owner. CommitID makes it idempotent.
//
// An authorization authorizes exactly one write: Target names the object
// the write changes in the sink (a document id, a job document) and
// PayloadSHA256 the hex SHA-256 of what it writes there, as the sink
// computes it (empty only where the sink cannot check a payload). Both are
// covered by the commit's digest, so a replay of the commit id answers for
// that write alone (another target or payload is idempotency_conflict), and
// both travel in the guard, which every sink checks against the write it
// performs. ExecutionID and JobID must be the lease's own: the backend
// compares them with the active record (lease_lost otherwise), so a guard
// names the job it was issued for.
//
// With Outbox set, an authorized commit also appends the message to the
// store's fenced outbox in the same atomic operation as the lease check, so
// a stale holder's publication never enters it; a relay publishes entries
// and removes them once the broker confirmed (Outbox interface). The
// message is then the write: Target and PayloadSHA256 must be empty and
// are set to the message id and the SHA-256 of the body. A publication past
// the outbox's bounds (StoreOptions.OutboxMaxPending, OutboxMaxBytes) is
// refused with OutboxFull, decided in the same atomic step, and changes
// nothing: the commit id stays unused.
//
// With ReplayOnly set, the backend answers only from stored evidence of
// the commit id: its replay (idempotency_conflict when the inputs differ),
// else RequestNotFound (lease_not_found), and writes nothing. It does not
// check the lease, so the replay of a commit accepted before the lease
// ended still answers. It is how a caller that may not start a new commit
// now (a rate limit refused it) still resolves the retry of one it made.
// It is not part of the commit's digest: it does not change the write.
type CommitRequest struct {
	Identity          Identity
	LeaseID           string
	FencingToken      uint64
	ServiceInstanceID string
	Sink              string
	CommitID          string
	ExecutionID       string
	JobID             string
	TraceID           string
	Target            string
	PayloadSHA256     string
	Outbox            *OutboxMessage
	DeadlineAt        time.Time
	Caller            Caller
	ReplayOnly        bool
}

// Commit is the accepted-commit evidence of the prepared request r,
// accepted at backend time at as the lock key's commit seq, with digest.
func (r CommitRequest) Commit(at Timestamp, seq uint64, digest string) Commit {
	return Commit{Sink: r.Sink, CommitID: r.CommitID, LeaseID: r.LeaseID, FencingToken: r.FencingToken,
		ExecutionID: r.ExecutionID, JobID: r.JobID, TraceID: r.TraceID, Target: r.Target,
		PayloadSHA256: r.PayloadSHA256, Seq: seq, AcceptedAt: at, Digest: digest}
}

// MaxCommitTargetBytes bounds CommitRequest.Target.
const MaxCommitTargetBytes = 2048

// LookupRequest names a mutation by its idempotency scope.
type LookupRequest struct {
	Op          Op
	Identity    Identity
	PrincipalID string
	RequestID   string
	DeadlineAt  time.Time
}

// Result is the typed result of a lease operation.
type Result struct {
	Code Code
	// Lease is the lease acted on, as the operation left it (for a replay:
	// as the original operation left it).
	Lease *Record
	// Current is, on a replay whose lease has since changed state, the
	// lease's state now.
	Current *Record
	// Replayed reports that the result was returned from idempotency evidence.
	Replayed bool
	// Op is the operation whose result this is (set on replays and by
	// LookupRequest).
	Op Op
	// BackendTime is the backend time of the decision.
	BackendTime Timestamp
}

// ListResult is a page of leases.
type ListResult struct {
	Leases        []*Record
	NextPageToken string
	BackendTime   Timestamp
}

// HistoryEntry is terminal evidence of a lease: the record in its terminal
// state plus who ended it, when and why. Versioned separately from Record.
type HistoryEntry struct {
	HistoryVersion int       `json:"history_version"`
	Record         *Record   `json:"record"`
	EndedAt        Timestamp `json:"ended_at"`
	EndedBy        string    `json:"ended_by,omitempty"`
	RequestID      string    `json:"request_id,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	IncidentID     string    `json:"incident_id,omitempty"`
}

// HistoryResult is a page of terminal evidence.
type HistoryResult struct {
	Entries       []HistoryEntry
	NextPageToken string
	BackendTime   Timestamp
}

// Commit is an accepted commit authorization: the one write (Target,
// PayloadSHA256) it authorizes under the lease, execution and job. Seq
// orders the commits the backend accepted for one lock key (it strictly
// increases, whatever the sink): a sink holding a lease's later commit
// refuses that lease's earlier one, so replaying an old authorization
// never rolls an object back. Evidence of version 1 (before the binding
// existed) has no Target, JobID, PayloadSHA256 or Seq; its digest never
// matches a request of today, so a replay of it is idempotency_conflict.
type Commit struct {
	Sink          string    `json:"sink"`
	CommitID      string    `json:"commit_id"`
	LeaseID       string    `json:"lease_id"`
	FencingToken  uint64    `json:"fencing_token"`
	ExecutionID   string    `json:"execution_id"`
	JobID         string    `json:"job_id,omitempty"`
	TraceID       string    `json:"trace_id,omitempty"`
	Target        string    `json:"target,omitempty"`
	PayloadSHA256 string    `json:"payload_sha256,omitempty"`
	Seq           uint64    `json:"commit_seq,omitempty"`
	AcceptedAt    Timestamp `json:"accepted_at"`
	Digest        string    `json:"digest"`
}

// CommitResult is the typed result of AuthorizeCommit.
type CommitResult struct {
	Code        Code
	Commit      Commit
	Replayed    bool
	BackendTime Timestamp
}

// HealthStatus classifies backend health.
type HealthStatus string

const (
	HealthOK          HealthStatus = "ok"
	HealthDegraded    HealthStatus = "degraded"
	HealthUnsuitable  HealthStatus = "unsuitable"
	HealthUnavailable HealthStatus = "unavailable"
)

// Health is a backend's health. Reason is safe to show operators.
type Health struct {
	Status HealthStatus
	Reason string
}

// StoreOptions configures behaviour every backend shares.
type StoreOptions struct {
	OperationClasses OperationClasses
	// MaxPageSize is the server maximum page size of List and History.
	MaxPageSize int
	// HistoryPerIdentity and HistoryRetention bound terminal evidence.
	HistoryPerIdentity int
	HistoryRetention   time.Duration
	// IdempotencyRetention must exceed MaxLifetime plus the client retry window.
	IdempotencyRetention time.Duration
	// CommitRetention bounds accepted-commit records (high-water marks are kept forever).
	CommitRetention time.Duration
	// OutboxMaxPending and OutboxMaxBytes bound the pending fenced outbox:
	// its entries, and their bytes as OutboxMessage.Size counts them. A
	// publication that would pass either is refused in the commit's atomic
	// step (OutboxFull), so a broker outage cannot grow the outbox without
	// limit. OutboxMaxBytes below MaxOutboxMessageBytes leaves some valid
	// publications no room even in an empty outbox.
	OutboxMaxPending int64
	OutboxMaxBytes   int64
	// Logger receives the store's events and ALERTs; nil means
	// slog.Default(). The stores screen secret-shaped values in it
	// (audit.ScreenLogger), such as a 64-hex target id in an ALERT.
	Logger *slog.Logger
}

// Defaults for StoreOptions.
const (
	DefaultMaxPageSize          = 100
	DefaultHistoryPerIdentity   = 64
	DefaultHistoryRetention     = 30 * 24 * time.Hour
	DefaultIdempotencyRetention = MaxLifetime + 24*time.Hour
	DefaultCommitRetention      = MaxLifetime + 24*time.Hour
	DefaultOutboxMaxPending     = 100000
	DefaultOutboxMaxBytes       = 256 << 20
)

// WithDefaults fills unset options.
func (o StoreOptions) WithDefaults() StoreOptions {
	if o.OperationClasses.allowed == nil {
		o.OperationClasses = DefaultOperationClasses()
	}
	if o.MaxPageSize <= 0 {
		o.MaxPageSize = DefaultMaxPageSize
	}
	if o.HistoryPerIdentity <= 0 {
		o.HistoryPerIdentity = DefaultHistoryPerIdentity
	}
	if o.HistoryRetention <= 0 {
		o.HistoryRetention = DefaultHistoryRetention
	}
	if o.IdempotencyRetention <= MaxLifetime {
		o.IdempotencyRetention = DefaultIdempotencyRetention
	}
	if o.CommitRetention <= MaxLifetime {
		o.CommitRetention = DefaultCommitRetention
	}
	if o.OutboxMaxPending <= 0 {
		o.OutboxMaxPending = DefaultOutboxMaxPending
	}
	if o.OutboxMaxBytes <= 0 {
		o.OutboxMaxBytes = DefaultOutboxMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
