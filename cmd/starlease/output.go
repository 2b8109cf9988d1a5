package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

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

// heldOutput is the printed result of an acquisition or a renewal, whose
// success says that the caller holds the lease. The replay of one whose
// lease has ended since (current in another state) holds nothing: it is
// lease_lost, so that `starlease acquire ... && work` does not go on.
func heldOutput(r lease.Result, requestID string, err error) (any, error) {
	if err == nil && r.Replayed && r.Lease != nil && r.Current != nil && r.Current.State != lease.StateActive {
		return nil, lease.Errorf(lease.CodeLost, "this request was answered before (%s of lease %s, token %d), and that lease is %s now; "+
			"acquire again with a new request id", r.Code, r.Lease.LeaseID, r.Lease.FencingToken, r.Current.State)
	}
	return leaseOutput(r, requestID), err
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
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		_, err = stdout.Write(append(escapeControls(b), '\n'))
	}
	if err != nil {
		fmt.Fprintf(stderr, "starlease: cannot write the result: %v\n", err)
		return exitOther
	}
	return exitOK
}

// escapeControls returns JSON text b with every control or format
// character (lease.IsControlOrFormat) that encoding/json leaves as it is
// (DEL, C1 controls, bidi and other format characters) written as a \u
// escape, which means the same in JSON: a terminal would act on them. Past
// ASCII, and DEL, they can only stand in strings; the ASCII controls
// encoding/json writes raw are the indentation's line breaks.
func escapeControls(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != 0x7f && (r < utf8.RuneSelf || !lease.IsControlOrFormat(r)) {
			if out != nil {
				out = append(out, b[i:i+n]...)
			}
			i += n
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(b)+16), b[:i]...)
		}
		for _, u := range utf16.Encode([]rune{r}) {
			out = fmt.Appendf(out, `\u%04x`, u)
		}
		i += n
	}
	if out == nil {
		return b
	}
	return out
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
	fmt.Fprintf(stderr, "%s\n", escapeControls(b))
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
