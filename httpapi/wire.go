package httpapi

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// MaxBodyBytes bounds every request body but a commit authorization's.
const MaxBodyBytes = 64 << 10

// MaxCommitBodyBytes bounds a commit authorization's body: it may carry a
// publication of up to lease.MaxOutboxBody (64 KiB) bytes, base64-encoded
// (87,384 bytes), with up to lease.MaxOutboxHeadersBytes (16 KiB) of header
// names and values, which a JSON encoder may escape to 6 bytes per byte
// (encoding/json writes '<' as \u003c; others write non-ASCII as \uXXXX):
// 98,304 bytes and 6 per header of quotes and separators, beside the
// commit's own fields (identity, ids, target: well under 16 KiB). That is
// at most about 198 KiB; the bound leaves room and is still fixed, read
// before decoding.
const MaxCommitBodyBytes = 256 << 10

// wireCode maps a typed code to the contract's wire table, which is closed:
// codes the table does not name travel as the row whose meaning they have.
func wireCode(c lease.Code) lease.Code {
	switch c {
	case lease.CodeForceReleased:
		return lease.CodeReleased // force-release records the released state
	case lease.CodeHistory:
		return lease.CodeListed
	case lease.CodeCommitAuthorized:
		return lease.CodeInspected // the lease was validated; the body carries the commit
	case lease.CodeCommitRejected:
		return lease.CodeLost // a token below the high-water mark is a stale holder
	case lease.CodeCorrupt, lease.CodeCounterExhausted:
		return lease.CodeBackendUnavailable // no safe answer; not retryable
	}
	return c
}

// statusOf is the HTTP status of a typed code, exactly the wire table.
func statusOf(c lease.Code) int {
	switch wireCode(c) {
	case lease.CodeInvalidRequest:
		return http.StatusBadRequest
	case lease.CodeInvalidCredential:
		return http.StatusUnauthorized
	case lease.CodeAccessDenied:
		return http.StatusForbidden
	case lease.CodeNotFound:
		return http.StatusNotFound
	case lease.CodeDeadlineExceeded:
		return http.StatusRequestTimeout
	case lease.CodeConflict, lease.CodeLost, lease.CodeIdempotencyConflict:
		return http.StatusConflict
	case lease.CodeRateLimited:
		return http.StatusTooManyRequests
	case lease.CodeBackendUnavailable, lease.CodeOutcomeUnknown:
		return http.StatusServiceUnavailable
	}
	if c.Success() {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// defaultRetryAfter is the hint for retryable errors without their own.
const defaultRetryAfter = 250 * time.Millisecond

func newErrorBody(err error, correlationID string) (int, wire.Error) {
	le := lease.AsError(err)
	code := wireCode(le.Code)
	retryable := le.Code.Retryable()
	body := wire.Error{Status: "error", Code: string(code), Msg: code.Message(), CorrelationID: correlationID, Retryable: retryable}
	switch {
	case le.Code == lease.CodeInvalidRequest:
		body.Field = le.Field
		if le.Reason != "" {
			body.Msg = code.Message() + ": " + le.Field + " " + le.Reason
		}
	case le.PublicReason && le.Reason != "":
		// A reason written for the caller (a full outbox, an exchange the
		// server does not publish to); every other reason stays in logs.
		body.Msg = code.Message() + ": " + le.Reason
	}
	if retryable {
		d := le.RetryAfter
		if d <= 0 {
			d = defaultRetryAfter
		}
		ms := max(d.Milliseconds(), 1)
		body.RetryAfterMs = &ms
	}
	return statusOf(le.Code), body
}

// writeJSON writes v with status; bodies are never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"status":"error","code":"lease_backend_unavailable"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, err error, correlationID string) {
	status, body := newErrorBody(err, correlationID)
	if body.RetryAfterMs != nil {
		w.Header().Set("Retry-After", fmt.Sprint((*body.RetryAfterMs+999)/1000))
	}
	writeJSON(w, status, body)
}

var correlationRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// correlationID honours a well-formed X-Correlation-ID, else mints one.
func correlationID(r *http.Request) string {
	if v := r.Header.Values("X-Correlation-ID"); len(v) == 1 && correlationRE.MatchString(v[0]) && !strings.Contains(v[0], "..") {
		return v[0]
	}
	return "corr_" + ulid.MustNew(ulid.Now(), rand.Reader).String()
}

// decodeBody strictly decodes a JSON body into v: a JSON content type, at
// most MaxBodyBytes, one object, no unknown fields, no trailing data.
func decodeBody(r *http.Request, v any) error { return decodeBodyLimit(r, v, MaxBodyBytes) }

// decodeBodyLimit is decodeBody with a body of at most limit bytes.
func decodeBodyLimit(r *http.Request, v any, limit int64) error {
	if err := checkContentType(r.Header.Values("Content-Type")); err != nil {
		return err
	}
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return lease.Invalid("body", fmt.Sprintf("must be at most %d bytes", limit))
		}
		return lease.Invalid("body", "could not be read")
	}
	if !utf8.Valid(b) {
		// encoding/json would quietly decode invalid bytes as U+FFFD.
		return lease.Invalid("body", "must be UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return lease.Invalid("body", "trailing data after the JSON object")
	}
	// encoding/json takes the last of duplicate keys and matches names
	// case-insensitively; an ambiguous body fails closed. A body that is
	// v's own encoding cannot be ambiguous (lease.IsOwnEncoding).
	if lease.IsOwnEncoding(b, v) {
		return nil
	}
	if err := lease.DecodeStrict(b, v); err != nil {
		return lease.Invalid("body", "duplicate or case-variant keys")
	}
	return nil
}

// checkContentType requires one Content-Type, exactly application/json
// with at most a charset parameter of utf-8, the only encoding a body is
// read in. A look-alike (application/jsonx), another charset or parameter,
// or none at all is refused: the body is not read on a guess.
func checkContentType(values []string) error {
	if len(values) != 1 {
		return lease.Invalid("Content-Type", "give exactly one, application/json")
	}
	mt, params, err := mime.ParseMediaType(values[0])
	if err != nil || mt != "application/json" {
		return lease.Invalid("Content-Type", "must be application/json")
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return lease.Invalid("Content-Type", "takes no parameter but charset=utf-8")
		}
	}
	return nil
}

// decodeError names the field a JSON error is about, never echoing input.
func decodeError(err error) error {
	var typ *json.UnmarshalTypeError
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &typ) && typ.Field == "":
		return lease.Invalid("body", "must be a JSON object")
	case errors.As(err, &typ):
		return lease.Invalid(typ.Field, "has the wrong type")
	case errors.As(err, &syn):
		return lease.Invalid("body", fmt.Sprintf("malformed JSON at offset %d", syn.Offset))
	case errors.Is(err, io.EOF):
		return lease.Invalid("body", "a JSON object is required")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		if len(name) > 64 || !correlationRE.MatchString(name) {
			name = "(unknown)"
		}
		return lease.Invalid(name, "is not a known field")
	}
	return lease.Invalid("body", "malformed JSON")
}
