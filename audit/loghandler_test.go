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
// one an audit event gives it, and everything else as it was.
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
		{"redacted form", g["seen"], already},
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
