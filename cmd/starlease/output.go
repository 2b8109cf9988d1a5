package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/starintel/starlease/lease"
)

// Exit statuses; see exitStatusText.
const (
	exitOK      = 0
	exitOther   = 1
	exitUsage   = 2
	exitRefused = 3
	exitBackend = 4
)

// exitCode maps a result code to the process exit status.
func exitCode(c lease.Code) int {
	switch c {
	case lease.CodeInvalidRequest:
		return exitUsage
	case lease.CodeConflict, lease.CodeLost, lease.CodeIdempotencyConflict, lease.CodeCommitRejected, lease.CodeNotFound:
		return exitRefused
	case lease.CodeBackendUnavailable, lease.CodeOutcomeUnknown, lease.CodeDeadlineExceeded, lease.CodeCorrupt:
		return exitBackend
	}
	return exitOther
}

// leaseResult is the printed form of a lease.Result.
type leaseResult struct {
	Code        lease.Code      `json:"code"`
	Op          lease.Op        `json:"op,omitempty"`
	Replayed    bool            `json:"replayed"`
	RequestID   string          `json:"request_id,omitempty"`
	Lease       *lease.Record   `json:"lease"`
	Current     *lease.Record   `json:"current,omitempty"`
	BackendTime lease.Timestamp `json:"backend_time,omitzero"`
}

func leaseOutput(r lease.Result, requestID string) leaseResult {
	return leaseResult{Code: r.Code, Op: r.Op, Replayed: r.Replayed, RequestID: requestID,
		Lease: printable(r.Lease), Current: printable(r.Current), BackendTime: r.BackendTime}
}

// listResult is the printed form of a lease.ListResult.
type listResult struct {
	Code          lease.Code      `json:"code"`
	Leases        []*lease.Record `json:"leases"`
	NextPageToken string          `json:"next_page_token"`
	BackendTime   lease.Timestamp `json:"backend_time,omitzero"`
}

func listOutput(r lease.ListResult) listResult {
	out := listResult{Code: lease.CodeListed, Leases: make([]*lease.Record, 0, len(r.Leases)),
		NextPageToken: r.NextPageToken, BackendTime: r.BackendTime}
	for _, rec := range r.Leases {
		out.Leases = append(out.Leases, printable(rec))
	}
	return out
}

// historyResult is the printed form of a lease.HistoryResult.
type historyResult struct {
	Code          lease.Code           `json:"code"`
	Entries       []lease.HistoryEntry `json:"entries"`
	NextPageToken string               `json:"next_page_token"`
	BackendTime   lease.Timestamp      `json:"backend_time,omitzero"`
}

func historyOutput(r lease.HistoryResult) historyResult {
	out := historyResult{Code: lease.CodeHistory, Entries: make([]lease.HistoryEntry, 0, len(r.Entries)),
		NextPageToken: r.NextPageToken, BackendTime: r.BackendTime}
	for _, h := range r.Entries {
		h.Record = printable(h.Record)
		out.Entries = append(out.Entries, h)
	}
	return out
}

// commitResult is the printed form of a lease.CommitResult.
type commitResult struct {
	Code        lease.Code      `json:"code"`
	Replayed    bool            `json:"replayed"`
	Commit      lease.Commit    `json:"commit"`
	BackendTime lease.Timestamp `json:"backend_time,omitzero"`
}

func commitOutput(r lease.CommitResult) commitResult {
	return commitResult{Code: r.Code, Replayed: r.Replayed, Commit: r.Commit, BackendTime: r.BackendTime}
}

// printable returns rec with metadata as an object, never null, as the
// record is stored.
func printable(rec *lease.Record) *lease.Record {
	if rec == nil || rec.Metadata != nil {
		return rec
	}
	c := rec.Clone()
	c.Metadata = lease.Metadata{}
	return c
}

// errorEnvelope is the contract's error envelope as the CLI prints it.
type errorEnvelope struct {
	Status       string     `json:"status"`
	Code         lease.Code `json:"code"`
	Field        string     `json:"field,omitempty"`
	Msg          string     `json:"msg"`
	Reason       string     `json:"reason,omitempty"`
	Retryable    bool       `json:"retryable"`
	RetryAfterMs int64      `json:"retry_after_ms,omitempty"`
	RequestID    string     `json:"request_id,omitempty"`
}

// succeed prints v as indented JSON on stdout.
func succeed(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "starlease: cannot write the result: %v\n", err)
		return exitOther
	}
	return exitOK
}

// fail prints err's envelope as one line on stderr and returns its exit
// status. requestID, when set, is the request id of the failed mutation.
func fail(stderr io.Writer, err error, requestID string) int {
	le := lease.AsError(err)
	env := errorEnvelope{Status: "error", Code: le.Code, Field: le.Field, Msg: le.Code.Message(),
		Reason: le.Reason, Retryable: le.Code.Retryable(), RequestID: requestID}
	if le.RetryAfter > 0 {
		env.RetryAfterMs = int64((le.RetryAfter + time.Millisecond - 1) / time.Millisecond)
	}
	b, _ := json.Marshal(env)
	fmt.Fprintf(stderr, "%s\n", b)
	return exitCode(le.Code)
}

// redactingWriter writes through to w with every occurrence of a secret
// replaced.
type redactingWriter struct {
	w       io.Writer
	secrets [][]byte
}

// redact returns w writing with the API key, and the secret part of it on
// its own, replaced by "[redacted]".
func redact(w io.Writer, key string) io.Writer {
	secrets := [][]byte{[]byte(key)}
	if i := strings.LastIndexByte(key, '_'); i >= 0 && len(key)-i > 16 {
		secrets = append(secrets, []byte(key[i+1:]))
	}
	return &redactingWriter{w: w, secrets: secrets}
}

func (r *redactingWriter) Write(p []byte) (int, error) {
	out := p
	for _, s := range r.secrets {
		if len(s) > 0 && bytes.Contains(out, s) {
			out = bytes.ReplaceAll(out, s, []byte("[redacted]"))
		}
	}
	if _, err := r.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
