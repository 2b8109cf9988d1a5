package lease

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// RecordVersion is the only record version this code reads or writes.
const RecordVersion = 1

// Bounds on stored values; the strict decoder fails closed outside them.
const (
	// MaxFencingToken is the last token ever issued: 2^53-1, the largest
	// integer every JSON reader holds exactly.
	MaxFencingToken uint64 = 1<<53 - 1
	// MaxTTL and MaxLifetime are hard ceilings; service policy narrows them.
	MaxTTL      = 24 * time.Hour
	MaxLifetime = 7 * 24 * time.Hour
	// MaxMetadataKeys and MaxMetadataBytes bound the metadata object.
	MaxMetadataKeys  = 32
	MaxMetadataBytes = 4096
	// MaxReasonBytes bounds administrator reasons.
	MaxReasonBytes = 512
)

// State is an externally observable lease state.
type State string

const (
	StateActive   State = "active"
	StateExpired  State = "expired"
	StateReleased State = "released"
	StateRevoked  State = "revoked"
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case StateActive, StateExpired, StateReleased, StateRevoked:
		return true
	}
	return false
}

// Terminal reports whether s is a terminal state.
func (s State) Terminal() bool { return s == StateExpired || s == StateReleased || s == StateRevoked }

const timestampLayout = "2006-01-02T15:04:05.000Z"

// Timestamp is a UTC instant with millisecond precision, encoded as RFC 3339
// with exactly three fractional digits and "Z".
type Timestamp struct{ t time.Time }

// At converts t, truncating to the millisecond.
func At(t time.Time) Timestamp { return Timestamp{t.UTC().Truncate(time.Millisecond)} }

// UnixMilli builds a Timestamp from milliseconds since the epoch.
func UnixMilli(ms int64) Timestamp { return Timestamp{time.UnixMilli(ms).UTC()} }

// Time returns the instant.
func (ts Timestamp) Time() time.Time { return ts.t }

// UnixMilli returns milliseconds since the epoch.
func (ts Timestamp) UnixMilli() int64 { return ts.t.UnixMilli() }

// inRange reports whether ts is set and encodable in the contract form.
func (ts Timestamp) inRange() bool { return ts.t.Year() >= 1970 && ts.t.Year() <= 9999 }

// IsZero reports whether ts is unset.
func (ts Timestamp) IsZero() bool { return ts.t.IsZero() }

// Add returns ts+d.
func (ts Timestamp) Add(d time.Duration) Timestamp { return At(ts.t.Add(d)) }

// Before reports ts < o.
func (ts Timestamp) Before(o Timestamp) bool { return ts.t.Before(o.t) }

func (ts Timestamp) String() string {
	var buf [len(timestampLayout)]byte
	return string(appendTimestamp(buf[:0], ts.t))
}

// appendTimestamp appends t in timestampLayout exactly as
// t.AppendFormat(b, timestampLayout) does, without interpreting the
// layout on every call (every record, evidence and history encoding
// formats three or four times); a year outside 0..9999 goes to
// AppendFormat.
func appendTimestamp(b []byte, t time.Time) []byte {
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, timestampLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	return append(b, 'Z')
}

// MarshalJSON writes the contract's timestamp form.
func (ts Timestamp) MarshalJSON() ([]byte, error) {
	if ts.t.IsZero() {
		return nil, fmt.Errorf("lease: zero timestamp")
	}
	return []byte(`"` + ts.String() + `"`), nil
}

// UnmarshalJSON accepts only the exact contract form.
func (ts *Timestamp) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timestamp must be a string")
	}
	t, err := ParseTimestamp(s)
	if err != nil {
		return err
	}
	*ts = t
	return nil
}

// ParseTimestamp parses the exact contract form "YYYY-MM-DDTHH:MM:SS.mmmZ".
func ParseTimestamp(s string) (Timestamp, error) {
	t, err := time.Parse(timestampLayout, s)
	if err != nil || t.Format(timestampLayout) != s {
		return Timestamp{}, fmt.Errorf("timestamp must be RFC 3339 UTC with milliseconds")
	}
	return Timestamp{t.UTC()}, nil
}

// Metadata is the bounded, non-secret metadata object: at most 32 keys that
// follow the identifier rule, scalar values only (string, number, boolean,
// null), at most 4 KiB encoded, and no credential material (see
// ValidateMetadata). It is stored in records and history and returned to
// readers of the lease; it never reaches audit events.
type Metadata map[string]any

// MarshalJSON writes a nil Metadata as the empty object: metadata is always
// an object on the wire and at rest.
func (m Metadata) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(map[string]any(m))
}

// Record is lease record v1, exactly the contract's fields.
type Record struct {
	RecordVersion     int       `json:"record_version"`
	LockKey           string    `json:"lock_key"`
	TenantID          string    `json:"tenant_id"`
	ProgramID         string    `json:"program_id"`
	TargetNamespace   string    `json:"target_namespace"`
	TargetID          string    `json:"target_id"`
	ActorName         string    `json:"actor_name"`
	WorkflowName      string    `json:"workflow_name"`
	OperationClass    string    `json:"operation_class"`
	LeaseID           string    `json:"lease_id"`
	OwnerPrincipalID  string    `json:"owner_principal_id"`
	OwnerClientID     string    `json:"owner_client_id"`
	OwnerCredentialID string    `json:"owner_credential_id"`
	ServiceInstanceID string    `json:"service_instance_id"`
	FencingToken      uint64    `json:"fencing_token"`
	AcquiredAt        Timestamp `json:"acquired_at"`
	RenewedAt         Timestamp `json:"renewed_at"`
	ExpiresAt         Timestamp `json:"expires_at"`
	TTLMs             int64     `json:"ttl_ms"`
	MaximumLifetimeMs int64     `json:"maximum_lifetime_ms"`
	ExecutionID       string    `json:"execution_id"`
	JobID             string    `json:"job_id"`
	TraceID           string    `json:"trace_id"`
	RequestID         string    `json:"request_id"`
	Metadata          Metadata  `json:"metadata"`
	State             State     `json:"state"`
}

// Identity returns the record's tuple.
func (r *Record) Identity() Identity {
	return Identity{r.TenantID, r.ProgramID, r.TargetNamespace, r.TargetID, r.ActorName, r.WorkflowName, r.OperationClass}
}

// SetIdentity copies id's tuple into r.
func (r *Record) SetIdentity(id Identity) {
	r.TenantID, r.ProgramID, r.TargetNamespace, r.TargetID = id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID
	r.ActorName, r.WorkflowName, r.OperationClass = id.ActorName, id.WorkflowName, id.OperationClass
}

// LiveAt reports whether r is authoritative at backend time now: state active
// and now strictly before expires_at.
func (r *Record) LiveAt(now Timestamp) bool {
	return r.State == StateActive && now.Before(r.ExpiresAt)
}

// ObservedAt returns a copy of r as seen at backend time now: an active
// record past its expiry is reported as expired.
func (r *Record) ObservedAt(now Timestamp) *Record {
	c := r.Clone()
	if c.State == StateActive && !now.Before(c.ExpiresAt) {
		c.State = StateExpired
	}
	return c
}

// Clone returns a deep copy.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	if r.Metadata != nil {
		c.Metadata = make(Metadata, len(r.Metadata))
		for k, v := range r.Metadata {
			c.Metadata[k] = v
		}
	}
	return &c
}

// Encode validates r and returns its canonical JSON. Backends store exactly
// these bytes.
func (r *Record) Encode() ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	return appendRecord(make([]byte, 0, 1024), r)
}

// DecodeRecord is the strict decoder of stored records: it accepts only
// the exact bytes Record.Encode writes for a valid record, as every
// backend writes them (the Valkey library's own reader is as strict).
// Anything else fails closed with a corrupt *Error: unknown fields,
// trailing data, a wrong version, a tuple that is not canonical or does
// not hash to lock_key, a bad state, an out-of-bounds value, and also a
// valid record spelled another way (whitespace, field order, escapes,
// null for a string), which no writer produces.
func DecodeRecord(b []byte) (*Record, error) {
	if r, ok := decodeCanonicalRecord(b); ok {
		return r, nil
	}
	// The general decoder names the fault if there is one.
	var r Record
	if err := decodeStored("record", b, &r, r.validateStored); err != nil {
		return nil, err
	}
	return &r, nil
}

// decodeStored decodes bytes a backend stored into v: strictly, then
// validate (which reads v), then only if b is v's exact canonical
// encoding, as every writer writes it. Faults are corrupt, named by what.
func decodeStored(what string, b []byte, v any, validate func() error) error {
	canonical, err := decodeValid(what, b, v, validate)
	if err == nil && !canonical {
		err = corrupt(what + ": not in canonical form")
	}
	return err
}

// decodeValid is decodeStored whatever the spelling: it reports whether
// b is canonical instead of refusing it.
func decodeValid(what string, b []byte, v any, validate func() error) (canonical bool, err error) {
	canonical, err = strictDecode(b, v)
	if err != nil {
		return false, corrupt(what + ": " + err.Error())
	}
	if err := validate(); err != nil {
		return false, corrupt(what + ": " + AsError(err).Reason)
	}
	return canonical, nil
}

// validateStored is validate for decoded bytes, where a missing or null
// metadata member is also a fault (encoding always writes an object).
func (r *Record) validateStored() error { return r.check(true) }

func (r *Record) check(stored bool) error {
	if stored && r.Metadata == nil {
		return Invalid("metadata", "must be a JSON object")
	}
	return r.validate()
}

func corrupt(reason string) *Error { return &Error{Code: CodeCorrupt, Reason: reason} }

// DecodeStrict decodes untrusted JSON into v as strictly as stored records
// are: one value, no unknown, duplicate or case-variant keys, no trailing
// data. Unlike a stored record's, the input need not be v's own encoding: a
// key is checked against the names v's type declares, so an optional
// (omitempty) member sent with its zero value is accepted.
func DecodeStrict(b []byte, v any) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("malformed: not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed: %s", sanitizeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data")
	}
	tree, err := parseTree(b)
	if err != nil {
		return err
	}
	return declaredKeys(tree, reflect.TypeOf(v), "")
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// declaredKeys reports a key of in that t does not declare exactly:
// encoding/json matches keys case-insensitively, so DisallowUnknownFields
// lets a case variant of a declared name through.
func declaredKeys(in any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // decodes itself
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := in.(jsonObject)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		for k, v := range obj {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown field %q", path+k)
			}
			if err := declaredKeys(v, ft, path+k+"."); err != nil {
				return err
			}
		}
	case reflect.Map:
		if obj, ok := in.(jsonObject); ok {
			for k, v := range obj {
				if err := declaredKeys(v, t.Elem(), path+k+"."); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if arr, ok := in.([]any); ok {
			for _, v := range arr {
				if err := declaredKeys(v, t.Elem(), path); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

var jsonFieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields is the JSON member names of a struct type with their types,
// embedded structs' fields promoted as encoding/json promotes them.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := jsonFieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, shadowed := m[k]; !shadowed {
						m[k] = v // a field of the outer struct wins
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	jsonFieldCache.Store(t, m)
	return m
}

// strictUnmarshal decodes exactly one JSON value into v, rejecting unknown
// fields, trailing data, numbers outside v's types, duplicate keys and keys
// that match a field only case-insensitively (encoding/json accepts both).
func strictUnmarshal(b []byte, v any) error {
	_, err := strictDecode(b, v)
	return err
}

// strictDecode is strictUnmarshal that also reports whether b is exactly
// v's canonical encoding (json.Marshal(v)), as stored evidence must be.
func strictDecode(b []byte, v any) (canonical bool, err error) {
	if !utf8.Valid(b) {
		// encoding/json would quietly decode invalid bytes as U+FFFD.
		return false, fmt.Errorf("malformed: not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("malformed: %s", sanitizeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return false, fmt.Errorf("trailing data")
	}
	enc, err := json.Marshal(v)
	if err != nil {
		// Only a missing timestamp fails to re-encode, and validation
		// rejects that with a precise reason.
		return false, nil
	}
	if bytes.Equal(enc, b) {
		return true, nil // our own encoding: no duplicate or case-variant key
	}
	in, err := parseTree(b)
	if err != nil {
		return false, err
	}
	out, err := parseTree(enc)
	if err != nil {
		return false, err
	}
	return false, sameKeys(in, out, "")
}

// jsonObject is an object parsed with its exact keys.
type jsonObject map[string]any

// parseTree parses one JSON value keeping exact object keys and rejecting
// duplicates at any depth.
func parseTree(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return parseValue(dec)
}

func parseValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("malformed JSON")
	}
	switch tok {
	case json.Delim('{'):
		obj := jsonObject{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("malformed JSON")
			}
			k, _ := kt.(string)
			if _, dup := obj[k]; dup {
				return nil, fmt.Errorf("duplicate key %q", k)
			}
			if obj[k], err = parseValue(dec); err != nil {
				return nil, err
			}
		}
		_, err := dec.Token()
		return obj, err
	case json.Delim('['):
		var arr []any
		for dec.More() {
			e, err := parseValue(dec)
			if err != nil {
				return nil, err
			}
			arr = append(arr, e)
		}
		_, err := dec.Token()
		return arr, err
	}
	return tok, nil
}

// sameKeys reports a key of in that the canonical re-encoding out does not
// have at the same path: a case-variant spelling of a field.
func sameKeys(in, out any, path string) error {
	switch x := in.(type) {
	case jsonObject:
		y, _ := out.(jsonObject)
		for k, v := range x {
			w, ok := y[k]
			if !ok {
				return fmt.Errorf("unknown field %q", path+k)
			}
			if err := sameKeys(v, w, path+k+"."); err != nil {
				return err
			}
		}
	case []any:
		y, _ := out.([]any)
		for i := range x {
			if i < len(y) {
				if err := sameKeys(x[i], y[i], path); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// sanitizeJSONError keeps the decoder's field-level explanation but never
// echoes input bytes beyond a field name.
func sanitizeJSONError(err error) string {
	switch e := err.(type) {
	case *json.UnmarshalTypeError:
		return "wrong type for " + e.Field
	case *json.SyntaxError:
		return fmt.Sprintf("syntax error at offset %d", e.Offset)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "json: unknown field ") {
		return "unknown field " + strings.TrimPrefix(msg, "json: unknown field ")
	}
	return "invalid JSON"
}

// validate checks every invariant of a stored record.
func (r *Record) validate() error {
	if r.RecordVersion != RecordVersion {
		return Invalid("record_version", "unsupported record version")
	}
	if f, ok := r.Identity().hashesTo(r.LockKey); f == "lock_key" {
		return Invalid("lock_key", "stored tuple does not hash to lock_key")
	} else if !ok {
		return Invalid(f, "stored tuple is not canonical")
	}
	for _, f := range []struct{ name, v string }{
		{"lease_id", r.LeaseID}, {"owner_principal_id", r.OwnerPrincipalID},
		{"owner_client_id", r.OwnerClientID}, {"owner_credential_id", r.OwnerCredentialID},
		{"service_instance_id", r.ServiceInstanceID}, {"execution_id", r.ExecutionID},
		{"job_id", r.JobID}, {"request_id", r.RequestID},
	} {
		if err := CheckOpaqueID(f.name, f.v); err != nil {
			return err
		}
	}
	if r.TraceID != "" {
		if err := CheckOpaqueID("trace_id", r.TraceID); err != nil {
			return err
		}
	}
	if r.FencingToken < 1 || r.FencingToken > MaxFencingToken {
		return Invalid("fencing_token", "out of range")
	}
	for _, ts := range []struct {
		name string
		t    Timestamp
	}{{"acquired_at", r.AcquiredAt}, {"renewed_at", r.RenewedAt}, {"expires_at", r.ExpiresAt}} {
		if !ts.t.inRange() {
			return Invalid(ts.name, "must be a time between 1970 and 9999")
		}
	}
	if r.TTLMs < 1 || r.TTLMs > MaxTTL.Milliseconds() {
		return Invalid("ttl_ms", "out of range")
	}
	if r.MaximumLifetimeMs < 1 || r.MaximumLifetimeMs > MaxLifetime.Milliseconds() {
		return Invalid("maximum_lifetime_ms", "out of range")
	}
	if r.RenewedAt.Before(r.AcquiredAt) || !r.RenewedAt.Before(r.ExpiresAt) {
		return Invalid("renewed_at", "must lie in [acquired_at, expires_at)")
	}
	if r.ExpiresAt.UnixMilli() > r.AcquiredAt.UnixMilli()+r.MaximumLifetimeMs {
		return Invalid("expires_at", "exceeds acquired_at + maximum_lifetime_ms")
	}
	if r.ExpiresAt.UnixMilli()-r.RenewedAt.UnixMilli() > r.TTLMs {
		return Invalid("expires_at", "exceeds renewed_at + ttl_ms")
	}
	if !r.State.Valid() {
		return Invalid("state", "unknown state")
	}
	// The shape only: a record stored before metadata was screened for
	// credential material stays readable (refusing it would make its
	// identity unusable without removing anything); new requests are
	// screened by ValidateMetadata.
	return validateMetadataShape(r.Metadata)
}

// CheckOpaqueID validates a caller- or server-generated identifier (lease,
// principal, execution, job, trace, request ids): same character rule as
// identity components but case is preserved, since these are opaque tokens
// compared byte for byte.
func CheckOpaqueID(field, v string) error {
	if opaqueIDOK(v) {
		return nil
	}
	return opaqueIDFault(field, v)
}

// opaqueIDOK reports whether v passes every rule of CheckOpaqueID, in one
// pass: every stored record's ids are checked on each write, and the
// rules one by one took several passes over each. It may only say true
// when opaqueIDFault finds no fault (TestOpaqueIDFastPath).
func opaqueIDOK(v string) bool {
	if v == "" || len(v) > MaxIdentifierBytes {
		return false
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i == 0:
			return false
		case c == '.':
			if v[i-1] == '.' {
				return false
			}
		case c == ':' || c == '-':
		case c == '_':
			// "star_sk_" in any case, found at its first '_'; the bytes
			// compared are ASCII or fail the charset anyway.
			if i >= 4 && i+4 <= len(v) && v[i+3] == '_' && strings.EqualFold(v[i-4:i], "star") && strings.EqualFold(v[i+1:i+3], "sk") {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// opaqueIDFault names the first rule of CheckOpaqueID that v breaks, or
// is nil.
func opaqueIDFault(field, v string) error {
	if v == "" {
		return Invalid(field, "must not be empty")
	}
	if len(v) > MaxIdentifierBytes {
		return Invalid(field, "must be at most 256 bytes")
	}
	if !utf8.ValidString(v) {
		return Invalid(field, "must be valid UTF-8")
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'):
		default:
			return Invalid(field, "may contain only ASCII letters, digits and . _ : - and must start with a letter or digit")
		}
	}
	if strings.Contains(v, "..") {
		return Invalid(field, "must not contain ..")
	}
	// The charset admits a whole API key (star_sk_v1_<ULID>_<64 hex>);
	// opaque ids are stored, audited and returned, so none may carry one.
	if containsLower(v, "star_sk_") {
		return Invalid(field, "must not hold an API key (star_sk_)")
	}
	return nil
}

// ValidateMetadata enforces the metadata rule of a request: the bounded
// shape (at most 32 canonical keys, scalar values, 4 KiB encoded) and no
// credential material — no key that names a credential (password, secret,
// token, api_key, authorization, ...) and no value that SecretShaped
// refuses. Metadata is for short, non-secret labels; a digest belongs in
// the lock identity, not here.
func ValidateMetadata(m Metadata) error {
	if err := validateMetadataShape(m); err != nil {
		return err
	}
	return checkMetadataSecretFree(m)
}

// validateMetadataShape is the metadata rule without the secret screen.
func validateMetadataShape(m Metadata) error {
	if len(m) > MaxMetadataKeys {
		return Invalid("metadata", "at most 32 keys")
	}
	for k, v := range m {
		if n, err := NormalizeIdentifier("metadata", k); err != nil || n != k {
			return Invalid("metadata", "keys must be canonical identifiers")
		}
		switch x := v.(type) {
		case nil, bool, string:
		case json.Number:
			if _, err := x.Float64(); err != nil {
				return Invalid("metadata."+k, "invalid number")
			}
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return Invalid("metadata."+k, "number must be finite")
			}
		case int, int64, uint64, int32:
		default:
			return Invalid("metadata."+k, "values must be scalars")
		}
		if s, ok := v.(string); ok && !utf8.ValidString(s) {
			return Invalid("metadata."+k, "must be valid UTF-8")
		}
	}
	if len(m) == 0 {
		return nil // "{}"
	}
	b, err := json.Marshal(m)
	if err != nil {
		return Invalid("metadata", "not encodable")
	}
	if len(b) > MaxMetadataBytes {
		return Invalid("metadata", "at most 4 KiB encoded")
	}
	return nil
}

// canonicalMetadata is the digest form of metadata: keys sorted (encoding/json
// sorts map keys), numbers as written.
func canonicalMetadata(m Metadata) []byte {
	if len(m) == 0 {
		return []byte("{}")
	}
	b, _ := json.Marshal(m)
	return b
}

// DecodeMetadata strictly decodes a metadata object (numbers kept as written).
func DecodeMetadata(b []byte) (Metadata, error) {
	var m Metadata
	if err := strictUnmarshal(b, &m); err != nil || m == nil {
		return nil, Invalid("metadata", "must be a JSON object")
	}
	return m, ValidateMetadata(m)
}
