package auth

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestCredentialCodec(t *testing.T) {
	s := NewMemoryStore()
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, everything), TTL: time.Hour, Label: "ci runner"})
	b, err := EncodeCredential(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"record_version":1,`)) {
		t.Fatalf("record has no version: %s", b)
	}
	back, err := DecodeCredential(b)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := EncodeCredential(back); !bytes.Equal(again, b) {
		t.Fatal("record does not round-trip")
	}
	if !bytes.Equal(back.salt, c.salt) || !bytes.Equal(back.verifier, c.verifier) {
		t.Fatal("verifier lost")
	}

	mutate := map[string]func(string) string{
		"unknown field":  func(s string) string { return strings.Replace(s, `{`, `{"extra":1,`, 1) },
		"trailing data":  func(s string) string { return s + "{}" },
		"trailing space": func(s string) string { return s + " " },
		"version 2":      func(s string) string { return strings.Replace(s, `"record_version":1`, `"record_version":2`, 1) },
		"no version":     func(s string) string { return strings.Replace(s, `"record_version":1,`, ``, 1) },
		"duplicate key":  func(s string) string { return strings.Replace(s, `{`, `{"label":"x",`, 1) },
		"case key":       func(s string) string { return strings.Replace(s, `"label"`, `"Label"`, 1) },
		"upper hex salt": func(s string) string {
			return strings.Replace(s, hex.EncodeToString(c.salt), strings.ToUpper(hex.EncodeToString(c.salt)), 1)
		},
		"short verifier": func(s string) string { return strings.Replace(s, hex.EncodeToString(c.verifier), "00", 1) },
		"unknown class":  func(s string) string { return strings.Replace(s, `"api_client"`, `"root"`, 1) },
		"unknown cap":    func(s string) string { return strings.Replace(s, `"targets:lease"`, `"targets:all"`, 1) },
		"raw scope":      func(s string) string { return strings.Replace(s, `"tenant:*"`, `"tenant:A"`, 1) },
		"null scope": func(s string) string {
			return strings.Replace(s, `["tenant:*","program:*","target-namespace:*","target:*","actor:*"]`, `null`, 1)
		},
		"bad time":        func(s string) string { return strings.Replace(s, `"created_at":"`, `"created_at":"x`, 1) },
		"lower-case id":   func(s string) string { return strings.Replace(s, c.ID, strings.ToLower(c.ID), 1) },
		"not json":        func(string) string { return "not json" },
		"empty":           func(string) string { return "" },
		"replaced no rev": func(s string) string { return strings.Replace(s, `"label"`, `"replaced_by":"`+c.ID+`","label"`, 1) },
	}
	for name, m := range mutate {
		in := m(string(b))
		if in == string(b) {
			t.Fatalf("%s: mutation did not apply", name)
		}
		if _, err := DecodeCredential([]byte(in)); err != ErrCorrupt {
			t.Errorf("%s: DecodeCredential = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestCredentialNeverPrintsVerifier(t *testing.T) {
	key, c := issueT(t, NewMemoryStore(), IssueRequest{Scope: mustScope(t, everything), Label: "x"})
	salt, ver := hex.EncodeToString(c.salt), hex.EncodeToString(c.verifier)
	js, _ := json.Marshal(c)
	jsp, _ := json.Marshal(c.Public())
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "cred", c)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "cred", c)
	outs := []string{c.String(), fmt.Sprintf("%v|%+v|%#v|%s|%x|%q", c, c, c, c, c, c), string(js), string(jsp), logged.String()}
	for _, out := range outs {
		for _, secret := range []string{salt, ver, key, key[len(key)-64:], fmt.Sprint(c.salt), fmt.Sprint(c.verifier)} {
			if strings.Contains(out, secret) {
				t.Fatalf("credential output leaks a secret: %s", out)
			}
		}
		if !strings.Contains(out, c.ID) && !strings.Contains(out, fmt.Sprintf("%x", c.ID)) && !strings.Contains(out, fmt.Sprintf("%q", c.ID)) {
			t.Fatalf("output lacks the credential id: %s", out)
		}
	}
	if !strings.Contains(string(js), `"credential_id"`) || strings.Contains(string(js), `"salt"`) || strings.Contains(string(js), `"verifier"`) {
		t.Fatalf("JSON is not the public view: %s", js)
	}
}

func TestCredentialStatus(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := Credential{CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if c.Status(t0) != StatusActive || c.Status(t0.Add(time.Hour-time.Millisecond)) != StatusActive {
		t.Fatal("active before expiry")
	}
	if c.Status(t0.Add(time.Hour)) != StatusExpired {
		t.Fatal("expired at expires_at exactly")
	}
	c.RevokedAt = t0
	if c.Status(t0.Add(2*time.Hour)) != StatusRevoked {
		t.Fatal("revocation wins")
	}
}

func TestCredentialPublic(t *testing.T) {
	s := NewMemoryStore()
	_, c := issueT(t, s, IssueRequest{Scope: mustScope(t, "tenant:*"), TTL: time.Hour, Label: "l"})
	js, _ := json.Marshal(c)
	if strings.Contains(string(js), "revoked_at") || !strings.Contains(string(js), `"expires_at"`) {
		t.Fatalf("public view of a live expiring key: %s", js)
	}
	r, err := Revoke(t.Context(), s, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	pub := r.Public()
	if pub.RevokedAt == nil || !pub.RevokedAt.Equal(r.RevokedAt) || pub.ExpiresAt == nil || pub.Scope.String() != "tenant:*" {
		t.Fatalf("public view of a revoked key: %+v", pub)
	}
	js, _ = json.Marshal(r)
	for _, field := range []string{`"credential_id"`, `"principal_id"`, `"class"`, `"client_id"`, `"capabilities"`, `"scope":["tenant:*"]`, `"created_at"`, `"revoked_at"`, `"label":"l"`} {
		if !strings.Contains(string(js), field) {
			t.Errorf("public JSON lacks %s: %s", field, js)
		}
	}
}
