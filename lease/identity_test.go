package lease

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func TestCanonicalLockKeyGolden(t *testing.T) {
	id, key, err := CanonicalLockKey(contractIdentity(), DefaultOperationClasses())
	if err != nil {
		t.Fatalf("CanonicalLockKey: %v", err)
	}
	if key != goldenContractKey {
		t.Fatalf("key = %q, want golden %q", key, goldenContractKey)
	}
	if got := independentKey(t, id); key != got {
		t.Fatalf("key = %q, independently derived %q", key, got)
	}
	if id != contractIdentity() {
		t.Fatalf("normalized identity = %+v, want unchanged %+v", id, contractIdentity())
	}
}

// A non-ASCII component is hashed as raw UTF-8 (NFC), not as a \u escape.
// The literal was computed with python3 json.dumps(ensure_ascii=False).
func TestCanonicalLockKeyGoldenNonASCII(t *testing.T) {
	raw := Identity{TenantID: "ACME", ProgramID: "CAFE\u0301", TargetNamespace: "ns", TargetID: "t1", ActorName: "Actor"}
	id, key, err := CanonicalLockKey(raw, DefaultOperationClasses())
	if err != nil {
		t.Fatalf("CanonicalLockKey: %v", err)
	}
	want := Identity{"acme", "caf\u00e9", "ns", "t1", "actor", "default", "default"}
	if id != want {
		t.Fatalf("identity = %+v, want %+v", id, want)
	}
	const golden = "starintel:target-lease:v1:cwoK4W22KsEDTIspqeyyp2yHN9GAhnvcP18Y4PxrehI"
	if key != golden {
		t.Fatalf("key = %q, want %q", key, golden)
	}
	if got := independentKey(t, id); got != golden {
		t.Fatalf("independent key = %q, want %q", got, golden)
	}
}

func TestCanonicalLockKeyShape(t *testing.T) {
	_, key, err := CanonicalLockKey(contractIdentity(), DefaultOperationClasses())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, KeyPrefix) || KeyPrefix != "starintel:target-lease:v1:" {
		t.Fatalf("key %q lacks prefix", key)
	}
	suffix := strings.TrimPrefix(key, KeyPrefix)
	if len(suffix) != 43 {
		t.Fatalf("suffix length = %d, want 43", len(suffix))
	}
	raw, err := base64.RawURLEncoding.DecodeString(suffix)
	if err != nil || len(raw) != 32 {
		t.Fatalf("suffix %q is not unpadded base64url of 32 bytes: %v", suffix, err)
	}
}

func TestCanonicalEquivalentsShareOneKey(t *testing.T) {
	base := contractIdentity()
	classes, err := NewOperationClasses("bulk")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mut  func(*Identity)
	}{
		{"uppercase tenant", func(id *Identity) { id.TenantID = "TENANT-MAIN" }},
		{"mixed case every field", func(id *Identity) {
			*id = Identity{"Tenant-Main", "Program-A", "StarIntel-Target", "Target_01", "UserNameGen", "Default", "DEFAULT"}
		}},
		{"surrounding ASCII whitespace", func(id *Identity) {
			id.TenantID = " \t\r\n\v\ftenant-main \t\r\n\v\f"
			id.TargetID = "  target_01\n"
		}},
		{"empty workflow defaults", func(id *Identity) { id.WorkflowName = "" }},
		{"empty operation_class defaults", func(id *Identity) { id.OperationClass = "" }},
		{"whitespace-only workflow and class default", func(id *Identity) { id.WorkflowName, id.OperationClass = " \t", "\n" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := base
			tc.mut(&raw)
			id, key, err := CanonicalLockKey(raw, classes)
			if err != nil {
				t.Fatalf("CanonicalLockKey(%+v): %v", raw, err)
			}
			if key != goldenContractKey {
				t.Fatalf("key = %q, want %q", key, goldenContractKey)
			}
			if id != base {
				t.Fatalf("identity = %+v, want %+v", id, base)
			}
		})
	}
}

func TestUnicodeNormalizationEquivalents(t *testing.T) {
	nfc := "caf\u00e9"  // é precomposed
	nfd := "cafe\u0301" // e + combining acute
	if nfc == nfd || !norm.NFC.IsNormalString(nfc) || norm.NFC.IsNormalString(nfd) {
		t.Fatal("test inputs are not an NFC/NFD pair")
	}
	groups := [][]string{
		{nfc, nfd, "CAF\u00c9", "CAFE\u0301", " Cafe\u0301\t"},
		// Kelvin sign U+212A is NFC-equivalent to K.
		{"key", "\u212Aey", "KEY"},
		// Angstrom sign U+212B is NFC-equivalent to Å.
		{"\u00e5ngstr\u00f6m", "\u212Bngstro\u0308m", "A\u030angstr\u00d6m"},
	}
	for _, g := range groups {
		want, err := NormalizeIdentifier("f", g[0])
		if err != nil {
			t.Fatalf("NormalizeIdentifier(%q): %v", g[0], err)
		}
		var keys []string
		for _, raw := range g {
			got, err := NormalizeIdentifier("f", raw)
			if err != nil {
				t.Fatalf("NormalizeIdentifier(%q): %v", raw, err)
			}
			if got != want {
				t.Errorf("NormalizeIdentifier(%q) = %q, want %q", raw, got, want)
			}
			id := contractIdentity()
			id.TargetID = raw
			_, key, err := CanonicalLockKey(id, DefaultOperationClasses())
			if err != nil {
				t.Fatalf("CanonicalLockKey target %q: %v", raw, err)
			}
			keys = append(keys, key)
		}
		for i := range keys {
			if keys[i] != keys[0] {
				t.Errorf("%q and %q give different keys %q, %q", g[0], g[i], keys[0], keys[i])
			}
		}
	}
	if got, _ := NormalizeIdentifier("f", nfd); got != nfc {
		t.Fatalf("NFD input normalized to %q, want NFC %q", got, nfc)
	}
}

func TestNormalizeIdentifierAccepts(t *testing.T) {
	cases := map[string]string{
		"a":                           "a",
		"0":                           "0",
		"a.b_c:d-e":                   "a.b_c:d-e",
		"Target_01":                   "target_01",
		"a-":                          "a-",
		"a.":                          "a.",
		"x:y:z":                       "x:y:z",
		"\u65e5\u672c":                "\u65e5\u672c", // letters of other scripts
		"\u0661\u0662":                "\u0661\u0662", // Arabic-Indic digits
		"\u0130stanbul":               "istanbul",     // Go's simple lower case of İ is i
		strings.Repeat("a", 256):      strings.Repeat("a", 256),
		strings.Repeat("A", 256):      strings.Repeat("a", 256),
		strings.Repeat("\u00e9", 128): strings.Repeat("\u00e9", 128), // 256 bytes
		// 384 bytes raw in NFD, 256 bytes after NFC: the bound applies after normalization.
		strings.Repeat("e\u0301", 128):          strings.Repeat("\u00e9", 128),
		" \t" + strings.Repeat("b", 256) + "\n": strings.Repeat("b", 256),
	}
	for raw, want := range cases {
		got, err := NormalizeIdentifier("lock_identity.target_id", raw)
		if err != nil {
			t.Errorf("NormalizeIdentifier(%q): unexpected %v", raw, err)
			continue
		}
		if got != want {
			t.Errorf("NormalizeIdentifier(%q) = %q, want %q", raw, got, want)
		}
	}
}

// rejectCases are identifier inputs every field must reject, with the reason.
var rejectCases = []struct {
	name, raw, reason string
}{
	{"invalid utf8", "ab\xffcd", "must be valid UTF-8"},
	{"invalid utf8 lone continuation", "\x80", "must be valid UTF-8"},
	{"NUL", "a\x00b", "must not contain control characters"},
	{"BEL", "a\x07b", "must not contain control characters"},
	{"DEL", "a\x7fb", "must not contain control characters"},
	{"C1 NEL", "a\u0085b", "must not contain control characters"},
	{"interior tab", "a\tb", "must not contain control characters"},
	{"interior newline", "a\nb", "must not contain control characters"},
	{"trailing NUL", "ab\x00", "must not contain control characters"},
	{"slash", "a/b", "must not contain path separators"},
	{"backslash", "a\\b", "must not contain path separators"},
	{"leading slash", "/a", "must not contain path separators"},
	{"dotdot", "a..b", "must not contain .."},
	{"trailing dotdot", "a..", "must not contain .."},
	{"star", "a*b", "must not contain pattern characters"},
	{"question", "a?b", "must not contain pattern characters"},
	{"open bracket", "a[b", "must not contain pattern characters"},
	{"close bracket", "a]b", "must not contain pattern characters"},
	{"open brace", "a{b", "must not contain pattern characters"},
	{"close brace", "a}b", "must not contain pattern characters"},
	{"interior space", "a b", "must not contain whitespace"},
	{"interior NBSP", "a\u00a0b", "must not contain whitespace"},
	{"interior em space", "a\u2003b", "must not contain whitespace"},
	{"line separator", "a\u2028b", "must not contain whitespace"},
	{"leading NBSP is not trimmed", "\u00a0ab", "must not contain whitespace"},
	{"too long", strings.Repeat("a", 257), "must be at most 256 bytes"},
	{"too long multibyte", strings.Repeat("\u00e9", 128) + "a", "must be at most 256 bytes"},
	// U+023A (2 bytes) lowercases to U+2C65 (3 bytes): the bound is on the result.
	{"too long after lowercasing", strings.Repeat("\u023a", 128), "must be at most 256 bytes"},
	{"leading dot", ".a", "must start with a letter or digit"},
	{"leading hyphen", "-a", "must start with a letter or digit"},
	{"leading colon", ":a", "must start with a letter or digit"},
	{"leading underscore", "_a", "must start with a letter or digit"},
	{"leading combining mark", "\u0301a", "must start with a letter or digit"},
	{"at sign", "a@b", "may contain only letters, digits and . _ : -"},
	{"comma", "a,b", "may contain only letters, digits and . _ : -"},
	{"quote", "a\"b", "may contain only letters, digits and . _ : -"},
	{"plus", "a+b", "may contain only letters, digits and . _ : -"},
	{"zero width space", "a\u200bb", "may contain only letters, digits and . _ : -"},
	{"RTL override", "a\u202eb", "may contain only letters, digits and . _ : -"},
	{"percent encoding", "a%2fb", "may contain only letters, digits and . _ : -"},
}

func TestNormalizeIdentifierRejects(t *testing.T) {
	for _, tc := range rejectCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NormalizeIdentifier("lock_identity.target_id", tc.raw)
			if got != "" {
				t.Errorf("rejected input returned %q", got)
			}
			wantErr(t, err, CodeInvalidRequest, "lock_identity.target_id", tc.reason)
		})
	}
	for _, empty := range []string{"", " ", " \t\r\n\v\f"} {
		_, err := NormalizeIdentifier("x", empty)
		wantErr(t, err, CodeInvalidRequest, "x", "must not be empty")
	}
}

var identityFieldNames = []string{"tenant_id", "program_id", "target_namespace", "target_id", "actor_name", "workflow_name", "operation_class"}

func setField(id *Identity, name, v string) {
	switch name {
	case "tenant_id":
		id.TenantID = v
	case "program_id":
		id.ProgramID = v
	case "target_namespace":
		id.TargetNamespace = v
	case "target_id":
		id.TargetID = v
	case "actor_name":
		id.ActorName = v
	case "workflow_name":
		id.WorkflowName = v
	case "operation_class":
		id.OperationClass = v
	default:
		panic(name)
	}
}

func TestIdentityNormalizeRejectsEveryFieldWithItsName(t *testing.T) {
	for _, field := range identityFieldNames {
		for _, tc := range rejectCases {
			t.Run(field+"/"+tc.name, func(t *testing.T) {
				raw := contractIdentity()
				setField(&raw, field, tc.raw)
				id, err := raw.Normalize(DefaultOperationClasses())
				if id != (Identity{}) {
					t.Errorf("rejected identity returned %+v", id)
				}
				wantErr(t, err, CodeInvalidRequest, "lock_identity."+field, tc.reason)
				gotID, key, err := CanonicalLockKey(raw, DefaultOperationClasses())
				if key != "" || gotID != (Identity{}) {
					t.Errorf("rejected identity returned key %q", key)
				}
				wantErr(t, err, CodeInvalidRequest, "lock_identity."+field, tc.reason)
			})
		}
	}
	// Empty is rejected for the five fields without a default.
	for _, field := range identityFieldNames[:5] {
		raw := contractIdentity()
		setField(&raw, field, "")
		_, err := raw.Normalize(DefaultOperationClasses())
		wantErr(t, err, CodeInvalidRequest, "lock_identity."+field, "must not be empty")
	}
}

// The first invalid field in tuple order is the one reported.
func TestIdentityNormalizeReportsFirstFieldInOrder(t *testing.T) {
	raw := Identity{TenantID: "ok", ProgramID: "b/ad", TargetNamespace: "", TargetID: "x y", ActorName: "a"}
	_, err := raw.Normalize(DefaultOperationClasses())
	wantErr(t, err, CodeInvalidRequest, "lock_identity.program_id", "must not contain path separators")
}

func TestOperationClasses(t *testing.T) {
	raw := contractIdentity()
	raw.OperationClass = "fast"
	_, err := raw.Normalize(DefaultOperationClasses())
	wantErr(t, err, CodeInvalidRequest, "lock_identity.operation_class", "not a configured operation class")
	_, err = raw.Normalize(OperationClasses{})
	wantErr(t, err, CodeInvalidRequest, "lock_identity.operation_class", "not a configured operation class")

	classes, err := NewOperationClasses("fast", "bulk-scan")
	if err != nil {
		t.Fatalf("NewOperationClasses: %v", err)
	}
	for _, v := range []string{"default", "fast", "bulk-scan"} {
		if !classes.Contains(v) {
			t.Errorf("configured set lacks %q", v)
		}
	}
	for _, v := range []string{"FAST", "slow", "", "bulk"} {
		if classes.Contains(v) {
			t.Errorf("configured set contains %q", v)
		}
	}
	raw.OperationClass = " FAST "
	id, key, err := CanonicalLockKey(raw, classes)
	if err != nil {
		t.Fatalf("configured class rejected: %v", err)
	}
	if id.OperationClass != "fast" {
		t.Fatalf("operation_class = %q, want fast", id.OperationClass)
	}
	if key == goldenContractKey || key != independentKey(t, id) {
		t.Fatalf("key %q does not derive from operation_class fast", key)
	}

	var zero OperationClasses
	if !zero.Contains("default") || zero.Contains("fast") {
		t.Fatal("zero OperationClasses must hold exactly default")
	}
	def := DefaultOperationClasses()
	if !def.Contains("default") || def.Contains("fast") {
		t.Fatal("DefaultOperationClasses must hold exactly default")
	}
	if c, err := NewOperationClasses(); err != nil || !c.Contains("default") {
		t.Fatalf("NewOperationClasses() = %v, %v", c, err)
	}

	_, err = NewOperationClasses("Fast")
	wantErr(t, err, CodeInvalidRequest, "operation_class", "configured class must already be canonical")
	_, err = NewOperationClasses(" fast")
	wantErr(t, err, CodeInvalidRequest, "operation_class", "configured class must already be canonical")
	_, err = NewOperationClasses("a/b")
	wantErr(t, err, CodeInvalidRequest, "operation_class", "must not contain path separators")
	_, err = NewOperationClasses("")
	wantErr(t, err, CodeInvalidRequest, "operation_class", "must not be empty")
}

// The case rule folds every field; the per-field rule is applied to all seven.
func TestNormalizeFoldsCaseInEveryField(t *testing.T) {
	classes, _ := NewOperationClasses("op")
	raw := Identity{"TA", "PB", "NC", "TD", "AE", "WF", "OP"}
	id, err := raw.Normalize(classes)
	if err != nil {
		t.Fatal(err)
	}
	want := Identity{"ta", "pb", "nc", "td", "ae", "wf", "op"}
	if id != want {
		t.Fatalf("got %+v, want %+v", id, want)
	}
}

// The empty-default rule must not turn a rejected non-ASCII whitespace or
// control character into "default": the issue says trim ASCII whitespace,
// and the contract says normalization rejects control characters.
func TestEmptyDefaultOnlyForASCIIWhitespace(t *testing.T) {
	for _, field := range []string{"workflow_name", "operation_class"} {
		for _, v := range []string{"\u0085", "\u00a0", "\u2028", "\u3000"} {
			raw := contractIdentity()
			setField(&raw, field, v)
			id, err := raw.Normalize(DefaultOperationClasses())
			if err == nil {
				t.Fatalf("BUG: identity.go Identity.Normalize: %s=%q (rejected by NormalizeIdentifier) is silently "+
					"defaulted to %q because the default check uses strings.TrimSpace (Unicode whitespace, "+
					"including the C1 control U+0085) instead of ASCII-only trimming", field, v, DefaultComponent)
			}
			_ = id
			wantErr(t, err, CodeInvalidRequest, "lock_identity."+field, "")
		}
	}
}

func TestNoCollisionsAcrossFields(t *testing.T) {
	classes, err := NewOperationClasses("a", "b", "ab", "c", "bc", "v1")
	if err != nil {
		t.Fatal(err)
	}
	key := func(id Identity) string {
		t.Helper()
		_, k, err := CanonicalLockKey(id, classes)
		if err != nil {
			t.Fatalf("CanonicalLockKey(%+v): %v", id, err)
		}
		return k
	}
	base := Identity{"t", "p", "n", "x", "y", "w", "default"}

	// Moving a value between fields.
	swap := []struct{ a, b Identity }{
		{Identity{"a", "b", "n", "x", "y", "w", "default"}, Identity{"b", "a", "n", "x", "y", "w", "default"}},
		{Identity{"t", "p", "a", "b", "y", "w", "default"}, Identity{"t", "p", "b", "a", "y", "w", "default"}},
		{Identity{"t", "p", "n", "x", "a", "b", "default"}, Identity{"t", "p", "n", "x", "b", "a", "default"}},
		{Identity{"t", "p", "n", "x", "y", "a", "b"}, Identity{"t", "p", "n", "x", "y", "b", "a"}},
		{Identity{"a", "p", "n", "x", "y", "w", "default"}, Identity{"p", "a", "n", "x", "y", "w", "default"}},
	}
	for _, s := range swap {
		if ka, kb := key(s.a), key(s.b); ka == kb {
			t.Errorf("%+v and %+v collide on %q", s.a, s.b, ka)
		}
	}
	// Shifting characters between adjacent fields.
	shift := []struct{ a, b Identity }{
		{Identity{"ab", "c", "n", "x", "y", "w", "default"}, Identity{"a", "bc", "n", "x", "y", "w", "default"}},
		{Identity{"t", "ab", "c", "x", "y", "w", "default"}, Identity{"t", "a", "bc", "x", "y", "w", "default"}},
		{Identity{"t", "p", "ab", "c", "y", "w", "default"}, Identity{"t", "p", "a", "bc", "y", "w", "default"}},
		{Identity{"t", "p", "n", "ab", "c", "w", "default"}, Identity{"t", "p", "n", "a", "bc", "w", "default"}},
		{Identity{"t", "p", "n", "x", "ab", "c", "default"}, Identity{"t", "p", "n", "x", "a", "bc", "default"}},
		{Identity{"t", "p", "n", "x", "y", "ab", "c"}, Identity{"t", "p", "n", "x", "y", "a", "bc"}},
		// A separator-looking character does not let values merge.
		{Identity{"a:b", "c", "n", "x", "y", "w", "default"}, Identity{"a", "b:c", "n", "x", "y", "w", "default"}},
		{Identity{"a", "b", "c", "x", "y", "w", "default"}, Identity{"a.b", "c", "x", "x", "y", "w", "default"}},
	}
	for _, s := range shift {
		if ka, kb := key(s.a), key(s.b); ka == kb {
			t.Errorf("%+v and %+v collide on %q", s.a, s.b, ka)
		}
	}
	// A value that looks like the version tag is just a value.
	if key(Identity{"v1", "p", "n", "x", "a", "w", "default"}) == key(Identity{"p", "n", "x", "a", "w", "default", "v1"}) {
		t.Error("rotation collides")
	}

	// Vary each of the 7 fields independently: all keys distinct.
	values := []string{"a", "b", "c", "ab", "bc"}
	seen := map[string]string{key(base): "base"}
	for _, field := range identityFieldNames {
		for _, v := range values {
			id := base
			setField(&id, field, v)
			k := key(id)
			label := fmt.Sprintf("%s=%s", field, v)
			if prev, dup := seen[k]; dup {
				t.Errorf("%s collides with %s on %q", label, prev, k)
			}
			seen[k] = label
			if k != independentKey(t, id) {
				t.Errorf("%s: key %q differs from independent derivation", label, k)
			}
		}
	}
	if len(seen) != 1+len(identityFieldNames)*len(values) {
		t.Fatalf("got %d distinct keys", len(seen))
	}
}

// Exhaustive over single runes: every accepted identifier is a fixed point of
// normalization, NFC, lower case and contains no forbidden character.
func TestNormalizeIdentifierIdempotentOverAllRunes(t *testing.T) {
	if testing.Short() {
		t.Skip("exhaustive rune scan")
	}
	accepted := 0
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		raw := "a" + string(r)
		n, err := NormalizeIdentifier("f", raw)
		if err != nil {
			continue
		}
		accepted++
		checkNormalizedIdentifier(t, raw, n)
		if t.Failed() {
			return
		}
	}
	if accepted < 100000 {
		t.Fatalf("only %d runes accepted; expected the letters and digits of Unicode", accepted)
	}
}

// checkNormalizedIdentifier asserts the properties of an accepted identifier.
func checkNormalizedIdentifier(t testing.TB, raw, n string) {
	t.Helper()
	if !utf8.ValidString(n) {
		t.Errorf("%q: result %q is not valid UTF-8", raw, n)
	}
	if len(n) < 1 || len(n) > MaxIdentifierBytes {
		t.Errorf("%q: result %q has %d bytes", raw, n, len(n))
	}
	if strings.ContainsAny(n, "/\\*?[]{} \t\r\n\v\f") || strings.Contains(n, "..") {
		t.Errorf("%q: result %q holds a forbidden character", raw, n)
	}
	for _, r := range n {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			t.Errorf("%q: result %q holds control character %U", raw, n, r)
		}
	}
	if strings.ContainsRune("._:-", []rune(n)[0]) {
		t.Errorf("%q: result %q starts with punctuation", raw, n)
	}
	if !norm.NFC.IsNormalString(n) {
		t.Errorf("%q: result %q is not NFC", raw, n)
	}
	if strings.ToLower(n) != n {
		t.Errorf("%q: result %q is not lower case", raw, n)
	}
	again, err := NormalizeIdentifier("f", n)
	if err != nil || again != n {
		t.Errorf("%q: normalize(%q) = %q, %v; want a fixed point", raw, n, again, err)
	}
}
