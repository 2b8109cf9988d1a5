package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/starintel/starlease/lease"
)

// Values that may be credential material never reach a log line through
// LogHandler: in the message, an attribute, an error's text, a group or
// attributes bound with With; each is written as the Redactor's form, the
// one an audit event gives it, and everything else as it was. A literal
// in a redacted form is hashed too, as in events.
func TestLogHandlerRedactsSecretShapedValues(t *testing.T) {
	r, err := NewRedactor(bytes.Repeat([]byte{3}, 32))
	if err != nil {
		t.Fatal(err)
	}
	key := "star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32)
	hex64 := strings.Repeat("5e", 32)
	var buf bytes.Buffer
	log := slog.New(NewLogHandler(slog.NewJSONHandler(&buf, nil), r))
	already := r.Value(hex64)
	log.With("bound", hex64).WithGroup("g").Error("ALERT corrupt lease state; failing closed",
		"target_id", hex64, "tenant_id", "tenant-a", "err", errors.New("refused Bearer "+key),
		slog.Group("inner", "key", key, "n", 7), "seen", already, "token", uint64(42))
	line := buf.String()
	for _, secret := range []string{key, hex64, "Bearer "} {
		if strings.Contains(line, secret) {
			t.Fatalf("the log line holds %q:\n%s", secret, line)
		}
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	g, _ := got["g"].(map[string]any)
	inner, _ := g["inner"].(map[string]any)
	checks := []struct {
		what string
		got  any
		want any
	}{
		{"message", got["msg"], "ALERT corrupt lease state; failing closed"},
		{"bound attribute", got["bound"], r.Value(hex64)},
		{"target id", g["target_id"], r.Value(hex64)},
		{"tenant id", g["tenant_id"], "tenant-a"},
		{"error", g["err"], r.Value("refused Bearer " + key)},
		{"group member", inner["key"], r.Value(key)},
		{"group number", inner["n"], float64(7)},
		{"redacted form", g["seen"], r.Value(already)},
		{"token", g["token"], float64(42)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	// The identity attributes the lease package's ALERTs log.
	buf.Reset()
	lease.CorruptState(log, lease.Identity{TenantID: "tenant-a", ProgramID: "p", TargetNamespace: "web", TargetID: hex64,
		ActorName: "crawler", WorkflowName: "default", OperationClass: "default"}, "test")
	if strings.Contains(buf.String(), hex64) || !strings.Contains(buf.String(), r.Value(hex64)) {
		t.Fatalf("the corrupt-state ALERT logs the 64-hex target id as given: %s", buf.String())
	}
}

type secretName string

type panicky struct{}

func (*panicky) Error() string { panic("boom") }

type scopeLike []string

func (s scopeLike) String() string { return strings.Join(s, ",") }

func (s scopeLike) MarshalJSON() ([]byte, error) { return json.Marshal([]string(s)) }

// Review of LogHandler (session 46): kinds other than strings and errors
// (a slice, a map, a struct, a named string), attribute keys and group
// names are screened as the JSON handler would write them; an error whose
// Error panics does not take the caller down; and a value that is not
// credential material keeps the handler's own format.
func TestLogHandlerScreensEveryKindAndSurvivesPanics(t *testing.T) {
	r, err := NewRedactor(bytes.Repeat([]byte{4}, 32))
	if err != nil {
		t.Fatal(err)
	}
	hex64 := strings.Repeat("7c", 32)
	var buf bytes.Buffer
	log := slog.New(NewLogHandler(slog.NewJSONHandler(&buf, nil), r))
	var typedNil *panicky
	log.WithGroup(hex64).Warn("m", "slice", []string{"a", hex64}, "map", map[string]string{"k": "Bearer x"},
		"named", secretName(hex64), hex64, "as key", "struct", struct{ Label string }{hex64},
		"panics", &panicky{}, "typed nil", typedNil, "scope", scopeLike{"tenant:a", "program:b"})
	line := buf.String()
	if strings.Contains(line, hex64) || strings.Contains(line, "Bearer ") {
		t.Fatalf("the log line holds a secret-shaped value: %s", line)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	g, _ := got[r.Value(hex64)].(map[string]any)
	if g == nil {
		t.Fatalf("the group is not under its name's redacted form: %s", line)
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"slice", g["slice"], r.Value(`["a","` + hex64 + `"]`)},
		{"map", g["map"], r.Value(`{"k":"Bearer x"}`)},
		{"named string", g["named"], r.Value(`"` + hex64 + `"`)},
		{"key", g[r.Value(hex64)], "as key"},
		{"struct", g["struct"], r.Value(`{"Label":"` + hex64 + `"}`)},
		{"panicking error", g["panics"], "!PANIC: boom"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if s, ok := g["typed nil"].(string); !ok || !strings.HasPrefix(s, "!PANIC: ") {
		t.Errorf("typed nil error: %v, want a !PANIC text", g["typed nil"])
	}
	if sc, ok := g["scope"].([]any); !ok || len(sc) != 2 || sc[0] != "tenant:a" {
		t.Errorf("a value with no secret keeps the handler's format: %v", g["scope"])
	}
}

// ScreenLogger screens a plain logger (nil too: slog's default), and keeps
// a logger that already screens as it is, with its own key: a store or
// executor given serve's logger writes the same keyed forms as serve, and
// a value is never hashed twice.
func TestScreenLoggerWrapsOnce(t *testing.T) {
	r, err := NewRedactor(bytes.Repeat([]byte{5}, 32))
	if err != nil {
		t.Fatal(err)
	}
	hex64 := strings.Repeat("c4", 32)
	var buf bytes.Buffer
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("%v: %q", err, l)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}

	plain := slog.New(slog.NewJSONHandler(&buf, nil))
	ScreenLogger(plain, nil).Error("ALERT", "target_id", hex64)
	if got := lines(); len(got) != 1 || got[0]["target_id"] != Redacted {
		t.Fatalf("plain logger screened without a key: %v, want %q", got, Redacted)
	}

	keyed := ScreenLogger(plain, r)
	again := ScreenLogger(keyed.With("component", "store"), nil)
	again.Error("ALERT", "target_id", hex64)
	if got := lines(); len(got) != 1 || got[0]["target_id"] != r.Value(hex64) || got[0]["component"] != "store" {
		t.Fatalf("a screened logger screened again: %v, want target_id %q once (its own key)", got, r.Value(hex64))
	}

	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	slog.SetDefault(plain)
	ScreenLogger(nil, nil).Error("ALERT", "target_id", hex64)
	if got := lines(); len(got) != 1 || got[0]["target_id"] != Redacted {
		t.Fatalf("nil logger: %v, want slog's default, screened", got)
	}
}
