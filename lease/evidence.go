package lease

import (
	"crypto/rand"
	"encoding/json"

	"github.com/oklog/ulid/v2"
)

// NewLeaseID returns a new opaque lease id, "lease_" and a ULID whose time
// part is the backend time of the acquisition, so ids sort by acquisition.
func NewLeaseID(now Timestamp) string {
	return "lease_" + ulid.MustNew(uint64(now.UnixMilli()), rand.Reader).String()
}

// IdempotencyVersion is the version of stored idempotency evidence.
const IdempotencyVersion = 1

// IdempotencyRecord is the stored result of a mutation, kept with the
// mutation in the same atomic operation.
type IdempotencyRecord struct {
	Version     int       `json:"idempotency_version"`
	Op          Op        `json:"op"`
	Digest      string    `json:"digest"`
	Code        Code      `json:"code"`
	Lease       *Record   `json:"lease"`
	BackendTime Timestamp `json:"backend_time"`
}

// Encode returns the canonical JSON of e.
func (e *IdempotencyRecord) Encode() ([]byte, error) {
	if e.Lease == nil {
		return nil, corrupt("idempotency record without lease")
	}
	if err := e.Lease.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(e)
}

// DecodeIdempotencyRecord strictly decodes stored idempotency evidence.
func DecodeIdempotencyRecord(b []byte) (*IdempotencyRecord, error) {
	var e IdempotencyRecord
	if err := strictUnmarshal(b, &e); err != nil {
		return nil, corrupt("idempotency: " + err.Error())
	}
	if e.Version != IdempotencyVersion || !e.Op.Valid() || !e.Code.Success() || e.Lease == nil || len(e.Digest) != 64 {
		return nil, corrupt("idempotency: invalid evidence")
	}
	if err := e.Lease.validate(); err != nil {
		return nil, corrupt("idempotency: " + AsError(err).Reason)
	}
	return &e, nil
}

// Result is the replayed result of the stored evidence.
func (e *IdempotencyRecord) Result() Result {
	return Result{Code: e.Code, Lease: e.Lease.Clone(), Replayed: true, Op: e.Op, BackendTime: e.BackendTime}
}

// HistoryVersion is the version of stored terminal evidence.
const HistoryVersion = 1

// Encode returns the canonical JSON of h.
func (h *HistoryEntry) Encode() ([]byte, error) {
	if h.Record == nil || !h.Record.State.Terminal() {
		return nil, corrupt("history entry must hold a terminal record")
	}
	if err := h.Record.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(h)
}

// DecodeHistoryEntry strictly decodes stored terminal evidence.
func DecodeHistoryEntry(b []byte) (*HistoryEntry, error) {
	var h HistoryEntry
	if err := strictUnmarshal(b, &h); err != nil {
		return nil, corrupt("history: " + err.Error())
	}
	if h.HistoryVersion != HistoryVersion || h.Record == nil || !h.Record.State.Terminal() || h.EndedAt.IsZero() {
		return nil, corrupt("history: invalid entry")
	}
	if err := h.Record.validate(); err != nil {
		return nil, corrupt("history: " + AsError(err).Reason)
	}
	return &h, nil
}

// CommitVersion is the version of stored accepted-commit evidence.
const CommitVersion = 1

// commitEvidence is the stored form of an accepted commit.
type commitEvidence struct {
	Version int `json:"commit_version"`
	Commit
}

// EncodeCommit returns the stored form of an accepted commit.
func EncodeCommit(c Commit) ([]byte, error) {
	return json.Marshal(commitEvidence{Version: CommitVersion, Commit: c})
}

// DecodeCommit strictly decodes stored accepted-commit evidence.
func DecodeCommit(b []byte) (Commit, error) {
	var e commitEvidence
	if err := strictUnmarshal(b, &e); err != nil {
		return Commit{}, corrupt("commit: " + err.Error())
	}
	if e.Version != CommitVersion || e.FencingToken < 1 || e.FencingToken > MaxFencingToken || e.AcceptedAt.IsZero() || len(e.Digest) != 64 {
		return Commit{}, corrupt("commit: invalid evidence")
	}
	return e.Commit, nil
}
