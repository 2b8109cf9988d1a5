package lease

import (
	"crypto/rand"
	"encoding/json"

	"github.com/oklog/ulid/v2"
)

// LeaseIDPrefix starts every lease id this service issues.
const LeaseIDPrefix = "lease_"

// NewLeaseID returns a new opaque lease id, "lease_" and a ULID whose time
// part is now (the acquisition time as the generating side sees it), so ids
// roughly sort by acquisition. Nothing may rely on that order for safety.
func NewLeaseID(now Timestamp) string {
	return LeaseIDPrefix + ulid.MustNew(uint64(now.UnixMilli()), rand.Reader).String()
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

// validate checks every invariant of stored idempotency evidence; the
// encoder and the decoder share it, so nothing is written that cannot be read.
func (e *IdempotencyRecord) validate(stored bool) error {
	// An operation's evidence holds its own success (review 44: an acquire
	// retry answered lease_renewed from evidence damaged in its code line).
	if e.Version != IdempotencyVersion || !e.Op.Valid() || e.Code != e.Op.SuccessCode() || e.Lease == nil ||
		!isSHA256Hex(e.Digest) || !e.BackendTime.inRange() {
		return corrupt("invalid evidence")
	}
	return e.Lease.check(stored)
}

// Encode returns the canonical JSON of e.
func (e *IdempotencyRecord) Encode() ([]byte, error) {
	if err := e.validate(false); err != nil {
		return nil, corrupt("idempotency: " + AsError(err).Reason)
	}
	return appendIdempotencyRecord(make([]byte, 0, 1280), e)
}

// DecodeIdempotencyRecord strictly decodes stored idempotency evidence:
// only the exact bytes Encode writes, as for records.
func DecodeIdempotencyRecord(b []byte) (*IdempotencyRecord, error) {
	var e IdempotencyRecord
	if err := decodeStored("idempotency", b, &e, func() error { return e.validate(true) }); err != nil {
		return nil, err
	}
	return &e, nil
}

// Result is the replayed result of the stored evidence.
func (e *IdempotencyRecord) Result() Result {
	return Result{Code: e.Code, Lease: e.Lease.Clone(), Replayed: true, Op: e.Op, BackendTime: e.BackendTime}
}

// HistoryVersion is the version of stored terminal evidence.
const HistoryVersion = 1

func (h *HistoryEntry) validate(stored bool) error {
	if h.HistoryVersion != HistoryVersion || h.Record == nil || !h.Record.State.Terminal() || !h.EndedAt.inRange() {
		return corrupt("invalid entry")
	}
	if h.EndedBy != "" {
		if err := CheckOpaqueID("ended_by", h.EndedBy); err != nil {
			return err
		}
	}
	if h.RequestID != "" {
		if err := CheckOpaqueID("request_id", h.RequestID); err != nil {
			return err
		}
	}
	if h.IncidentID != "" {
		if err := CheckOpaqueID("incident_id", h.IncidentID); err != nil {
			return err
		}
	}
	if err := CheckReason(h.Reason); err != nil {
		return err
	}
	return h.Record.check(stored)
}

// Encode returns the canonical JSON of h.
func (h *HistoryEntry) Encode() ([]byte, error) {
	if err := h.validate(false); err != nil {
		return nil, corrupt("history: " + AsError(err).Reason)
	}
	return appendHistoryEntry(make([]byte, 0, 1280), h)
}

// DecodeHistoryEntry strictly decodes stored terminal evidence: only the
// exact bytes Encode writes.
func DecodeHistoryEntry(b []byte) (*HistoryEntry, error) {
	if h, ok := decodeCanonicalHistory(b); ok {
		return h, nil
	}
	// The general decoder names the fault if there is one.
	var h HistoryEntry
	if err := decodeStored("history", b, &h, func() error { return h.validate(true) }); err != nil {
		return nil, err
	}
	return &h, nil
}

// CommitVersion is the version of stored accepted-commit evidence. Version
// 2 binds the commit to its write (target, payload digest) and job; version
// 1 evidence, written before, is still read (see Commit).
const CommitVersion = 2

// commitEvidence is the stored form of an accepted commit.
type commitEvidence struct {
	Version int `json:"commit_version"`
	Commit
}

func (c Commit) validate(version int) error {
	if c.FencingToken < 1 || c.FencingToken > MaxFencingToken || !c.AcceptedAt.inRange() || !isSHA256Hex(c.Digest) {
		return corrupt("invalid evidence")
	}
	switch version {
	case 1:
		if c.Target != "" || c.PayloadSHA256 != "" || c.JobID != "" || c.Seq != 0 {
			return corrupt("invalid evidence")
		}
	case CommitVersion:
		if c.Seq < 1 || c.Seq > MaxFencingToken {
			return corrupt("invalid evidence")
		}
		if err := CheckCommitTarget(c.Target); err != nil {
			return err
		}
		if err := CheckPayloadSHA256(c.PayloadSHA256); err != nil {
			return err
		}
		if err := CheckOpaqueID("job_id", c.JobID); err != nil {
			return err
		}
	default:
		return corrupt("invalid evidence")
	}
	if n, err := NormalizeIdentifier("sink", c.Sink); err != nil || n != c.Sink {
		return corrupt("invalid sink")
	}
	for _, f := range []struct{ name, v string }{{"commit_id", c.CommitID}, {"lease_id", c.LeaseID}, {"execution_id", c.ExecutionID}} {
		if err := CheckOpaqueID(f.name, f.v); err != nil {
			return err
		}
	}
	if c.TraceID != "" {
		return CheckOpaqueID("trace_id", c.TraceID)
	}
	return nil
}

// EncodeCommit returns the stored form of an accepted commit.
func EncodeCommit(c Commit) ([]byte, error) {
	if err := c.validate(CommitVersion); err != nil {
		return nil, corrupt("commit: " + AsError(err).Reason)
	}
	return json.Marshal(commitEvidence{Version: CommitVersion, Commit: c})
}

// DecodeCommit strictly decodes stored accepted-commit evidence: only the
// exact bytes EncodeCommit writes.
func DecodeCommit(b []byte) (Commit, error) {
	var e commitEvidence
	err := decodeStored("commit", b, &e, func() error { return e.Commit.validate(e.Version) })
	if err != nil {
		return Commit{}, err
	}
	return e.Commit, nil
}
