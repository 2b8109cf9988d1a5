package lease

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// KeyPrefix prefixes every canonical lock key.
const KeyPrefix = "starintel:target-lease:v1:"

// InternalTenant is the tenant of the server's own leases (the outbox
// relay's, rabbitmq.RelayIdentity). No API key reaches it, whatever its
// scope, and no key can be granted it: a caller who could hold or end
// those leases could stop every tenant's publications.
const InternalTenant = "starlease"

// MaxIdentifierBytes bounds every identifier after normalization.
const MaxIdentifierBytes = 256

// DefaultComponent is the canonical absent value of workflow_name and
// operation_class: never an omitted tuple component.
const DefaultComponent = "default"

// Identity is the canonical lock identity: the ordered seven-field tuple.
//
// Case rule, per field: every component is folded to lower case after NFC.
// tenant_id, program_id and target_namespace are StarIntel slugs; target_id is
// a resolved target identifier, actor_name and workflow_name are component
// names and operation_class is a configured enum — in StarIntel none of them
// distinguishes case, so keeping case would let "Acme" and "acme" hold two
// leases over one target. Folding is therefore the rule for all seven.
type Identity struct {
	TenantID        string `json:"tenant_id"`
	ProgramID       string `json:"program_id"`
	TargetNamespace string `json:"target_namespace"`
	TargetID        string `json:"target_id"`
	ActorName       string `json:"actor_name"`
	WorkflowName    string `json:"workflow_name"`
	OperationClass  string `json:"operation_class"`
}

// identityFields lists the tuple in its canonical order with wire names.
func (id *Identity) fields() [7]struct {
	name string
	v    *string
} {
	return [7]struct {
		name string
		v    *string
	}{
		{"tenant_id", &id.TenantID},
		{"program_id", &id.ProgramID},
		{"target_namespace", &id.TargetNamespace},
		{"target_id", &id.TargetID},
		{"actor_name", &id.ActorName},
		{"workflow_name", &id.WorkflowName},
		{"operation_class", &id.OperationClass},
	}
}

// OperationClasses is the closed, configured set of operation classes.
type OperationClasses struct{ allowed map[string]bool }

// NewOperationClasses builds the closed set; every value must itself be a
// canonical identifier. "default" is always a member.
func NewOperationClasses(values ...string) (OperationClasses, error) {
	m := map[string]bool{DefaultComponent: true}
	for _, v := range values {
		n, err := NormalizeIdentifier("operation_class", v)
		if err != nil {
			return OperationClasses{}, err
		}
		if n != v {
			return OperationClasses{}, Invalid("operation_class", "configured class must already be canonical")
		}
		m[n] = true
	}
	return OperationClasses{allowed: m}, nil
}

// DefaultOperationClasses is the default configuration: only "default".
func DefaultOperationClasses() OperationClasses {
	return OperationClasses{allowed: map[string]bool{DefaultComponent: true}}
}

// Contains reports membership; the zero value holds only "default".
func (c OperationClasses) Contains(v string) bool {
	if c.allowed == nil {
		return v == DefaultComponent
	}
	return c.allowed[v]
}

// NormalizeIdentifier applies the identifier rule to one field: valid UTF-8,
// NFC, trim ASCII whitespace, lower case, 1..256 bytes, first rune a letter or
// digit, then only letters, digits and "._:-", no "..".
func NormalizeIdentifier(field, raw string) (string, error) {
	if !utf8.ValidString(raw) {
		return "", Invalid(field, "must be valid UTF-8")
	}
	s := foldIdentifier(raw)
	if s == "" {
		return "", Invalid(field, "must not be empty")
	}
	if len(s) > MaxIdentifierBytes {
		return "", Invalid(field, "must be at most 256 bytes")
	}
	if plainASCIIIdentifier(s) {
		return s, nil
	}
	if err := checkIdentifierRunes(field, s); err != nil {
		return "", err
	}
	return s, nil
}

// checkIdentifierRunes is the character rule of a folded identifier.
func checkIdentifierRunes(field, s string) error {
	for i, r := range s {
		switch {
		case unicode.IsControl(r):
			return Invalid(field, "must not contain control characters")
		case r == '/' || r == '\\':
			return Invalid(field, "must not contain path separators")
		case strings.ContainsRune("*?[]{}", r):
			return Invalid(field, "must not contain pattern characters")
		case unicode.IsSpace(r):
			return Invalid(field, "must not contain whitespace")
		case unicode.IsLetter(r) || unicode.IsDigit(r):
		case i > 0 && strings.ContainsRune("._:-", r):
		case i == 0:
			return Invalid(field, "must start with a letter or digit")
		default:
			return Invalid(field, "may contain only letters, digits and . _ : -")
		}
	}
	if strings.Contains(s, "..") {
		return Invalid(field, "must not contain ..")
	}
	return nil
}

// plainASCIIIdentifier reports the common identifier the rule below
// accepts as it is: lower-case ASCII letters and digits, then also . _ : -,
// no "..". Anything else takes the rule's own checks and reasons.
func plainASCIIIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'):
			if c == '.' && s[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return len(s) > 0
}

// foldIdentifier is the normalization of the identifier rule: NFC,
// ASCII space trimmed, lower case, NFC again.
func foldIdentifier(raw string) string {
	if isASCII(raw) {
		// NFC leaves ASCII unchanged, and lower-casing keeps it ASCII.
		return strings.ToLower(trimASCIISpace(raw))
	}
	return foldUnicode(raw)
}

func foldUnicode(raw string) string {
	return norm.NFC.String(strings.ToLower(trimASCIISpace(norm.NFC.String(raw))))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// trimASCIISpace trims only ASCII whitespace: any other space or control
// character must reach the identifier rule and be rejected.
func trimASCIISpace(s string) string { return strings.Trim(s, " \t\r\n\v\f") }

// Normalize validates and normalizes all seven fields, defaulting
// workflow_name and operation_class, and checks operation_class against the
// configured closed set.
func (id Identity) Normalize(classes OperationClasses) (Identity, error) {
	out := id
	if trimASCIISpace(out.WorkflowName) == "" {
		out.WorkflowName = DefaultComponent
	}
	if trimASCIISpace(out.OperationClass) == "" {
		out.OperationClass = DefaultComponent
	}
	for _, f := range out.fields() {
		n, err := NormalizeIdentifier("lock_identity."+f.name, *f.v)
		if err != nil {
			return Identity{}, err
		}
		*f.v = n
	}
	if !classes.Contains(out.OperationClass) {
		return Identity{}, Invalid("lock_identity.operation_class", "not a configured operation class")
	}
	return out, nil
}

// CanonicalLockKey is the one canonical-target-lock-key function: it
// validates and normalizes all seven fields and derives the opaque lock key.
func CanonicalLockKey(raw Identity, classes OperationClasses) (Identity, string, error) {
	id, err := raw.Normalize(classes)
	if err != nil {
		return Identity{}, "", err
	}
	return id, id.lockKeyOfCanonical(), nil
}

// lockKeyOfCanonical hashes an already-canonical tuple. Only CanonicalLockKey
// and the strict record decoder (which first checks the tuple is canonical)
// call it.
func (id Identity) lockKeyOfCanonical() string {
	parts := [8]string{"v1", id.TenantID, id.ProgramID, id.TargetNamespace,
		id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass}
	sum := sha256.Sum256(jsonStringArray(parts[:]))
	return KeyPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}

// hashesTo reports whether id is canonical and hashes to lockKey: if not,
// the field that is not canonical, or "lock_key" when the hash differs.
// Every record a store reads or writes is checked so, several times per
// operation (decode, history, evidence), so a tuple found sound is
// remembered with its lock key: the check (seven normalizations and a
// SHA-256) is a function of those eight strings alone, compared in full.
func (id Identity) hashesTo(lockKey string) (field string, ok bool) {
	slot := &soundTuples[tupleSlot(lockKey)]
	if t := slot.Load(); t != nil && t.lockKey == lockKey && t.id == id {
		return "", true
	}
	if f, ok := id.isCanonical(); !ok {
		return f, false
	}
	if id.lockKeyOfCanonical() != lockKey {
		return "lock_key", false
	}
	// Copies: a caller's strings may point into a buffer it reuses.
	for _, f := range id.fields() {
		*f.v = strings.Clone(*f.v)
	}
	slot.Store(&soundTuple{id: id, lockKey: strings.Clone(lockKey)})
	return "", true
}

// soundTuples holds tuples hashesTo found sound, one per slot (a lock
// key's last characters pick it); a bounded few hundred bytes each.
var soundTuples [64]atomic.Pointer[soundTuple]

type soundTuple struct {
	id      Identity
	lockKey string
}

func tupleSlot(lockKey string) int {
	n := len(lockKey)
	if n < 2 {
		return 0
	}
	return int(lockKey[n-1]^lockKey[n-2]<<2) & (len(soundTuples) - 1)
}

// isCanonical reports whether id is its own normalization under the
// identifier rule (operation_class membership is a configuration question
// checked at request time, not at decode time).
func (id Identity) isCanonical() (string, bool) {
	for _, f := range id.fields() {
		n, err := NormalizeIdentifier(f.name, *f.v)
		if err != nil || n != *f.v {
			return f.name, false
		}
	}
	return "", true
}

// CheckLockKey checks that k has the form every lock key has: KeyPrefix
// and the unpadded base64url of a SHA-256 (43 characters). It cannot tell
// which tuple k belongs to; it keeps foreign strings out of key names.
func CheckLockKey(k string) error {
	d, ok := strings.CutPrefix(k, KeyPrefix)
	if ok && len(d) == base64.RawURLEncoding.EncodedLen(sha256.Size) {
		if b, err := base64.RawURLEncoding.Strict().DecodeString(d); err == nil && len(b) == sha256.Size {
			return nil
		}
	}
	return Invalid("lock_key", "not a lock key")
}

// jsonStringArray is json.Marshal of a string array, written directly
// when every string is plain ASCII that encoding/json writes verbatim
// (canonical identifiers are), else by json.Marshal.
func jsonStringArray(parts []string) []byte {
	n := 1
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			if !verbatim(p[i]) {
				b, _ := json.Marshal(parts)
				return b
			}
		}
		n += len(p) + 3
	}
	b := make([]byte, 0, n)
	for i, p := range parts {
		if i == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, p...)
		b = append(b, '"')
	}
	return append(b, ']')
}
