package leasetest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// LogScreening checks that a store opened by a library caller with its
// own logger (open's log: a plain JSON handler, no screening of its own)
// never writes a secret-shaped value it was given to that log. The
// identity's target id is 64 hex digits (a SHA-256 of a URL, say), which
// audit treats as possible credential material. Its ALERTs (an exhausted
// fencing counter, a corrupt record) must name the identity, with that
// target id in its redacted form, and its raw digits must appear nowhere
// in the log.
func LogScreening(t *testing.T, open func(t *testing.T, log *slog.Logger) Backend) {
	t.Helper()
	var out testenv.Buffer
	b := open(t, slog.New(slog.NewJSONHandler(&out, nil)))
	s := &suite{opts: StoreOptions().WithDefaults(), shared: b}

	exhausted := s.env(t)
	exhausted.id.TargetID = hex64()
	exhausted.key = exhausted.keyOf(exhausted.id)
	exhausted.setCounter(exhausted.key, lease.MaxFencingToken)
	_, err := exhausted.st.Acquire(bg, exhausted.acquireReq())
	mustCode(t, err, lease.CodeCounterExhausted)

	corrupt := s.env(t)
	corrupt.id.TargetID = hex64()
	corrupt.key = corrupt.keyOf(corrupt.id)
	corrupt.putRaw(corrupt.key, []byte(`{"record_version":`))
	_, err = corrupt.inspect(corrupt.id)
	mustCode(t, err, lease.CodeCorrupt)
	_, err = corrupt.st.Acquire(bg, corrupt.acquireReq())
	mustCode(t, err, lease.CodeCorrupt)

	logged := out.String()
	for _, e := range []*env{exhausted, corrupt} {
		for _, form := range []string{e.id.TargetID, strings.ToUpper(e.id.TargetID)} {
			if strings.Contains(logged, form) {
				t.Fatalf("the store's log holds a 64-hex target id as given:\n%s", logged)
			}
		}
	}
	alert := alertOf(t, logged, "ALERT fencing counter exhausted", exhausted.id.TenantID)
	if alert["target_id"] != "redacted" {
		t.Fatalf("the exhausted counter's ALERT names target id %v, want its redacted form:\n%s", alert["target_id"], logged)
	}
	if alert["target_namespace"] != exhausted.id.TargetNamespace {
		t.Fatalf("the ALERT lost the identity's other fields: %v", alert)
	}
	if !strings.Contains(logged, "ALERT corrupt lease state") {
		t.Fatalf("no ALERT for the corrupt record:\n%s", logged)
	}
}

// alertOf is the JSON log line whose message starts with msg and whose
// tenant_id is tenant.
func alertOf(t *testing.T, logged, msg, tenant string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(logged, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(fmt.Sprint(m["msg"]), msg) && m["tenant_id"] == tenant {
			return m
		}
	}
	t.Fatalf("no %q line for tenant %s in the store's log:\n%s", msg, tenant, logged)
	return nil
}

// hex64 is a random 64-hex-digit value, lower case (canonical).
func hex64() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
