package lease

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestPageTokenRoundTrip(t *testing.T) {
	scope := "owner\x00" + OwnerIndexValue("prn_actor_01")
	for _, after := range []string{"lease_01", "x", "a\x00b", strings.Repeat("c", 600), "caf\u00e9"} {
		tok := EncodePageToken(after, scope)
		if strings.ContainsAny(tok, "=+/") {
			t.Fatalf("token %q is not unpadded base64url", tok)
		}
		got, err := DecodePageToken(tok, scope)
		if err != nil || got != after {
			t.Fatalf("DecodePageToken(Encode(%q)) = %q, %v", after, got, err)
		}
		if EncodePageToken(after, scope) != tok {
			t.Fatal("tokens are not deterministic")
		}
	}
	if got, err := DecodePageToken("", scope); got != "" || err != nil {
		t.Fatalf("empty token = %q, %v", got, err)
	}
	// The token's payload is the versioned object binding cursor to filter.
	raw, _ := base64.RawURLEncoding.DecodeString(EncodePageToken("lease_01", scope))
	if !strings.HasPrefix(string(raw), `{"v":1,"f":"`) || !strings.HasSuffix(string(raw), `","a":"lease_01"}`) {
		t.Fatalf("payload %s", raw)
	}
}

func TestPageTokenRejects(t *testing.T) {
	scope := "target\x00" + TargetIndexValue(contractIdentity())
	good := EncodePageToken("lease_01", scope)
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	tag := strings.TrimSuffix(strings.TrimPrefix(string(raw), `{"v":1,"f":"`), `","a":"lease_01"}`)
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	flip := []byte(tag)
	if flip[0] == 'A' {
		flip[0] = 'B'
	} else {
		flip[0] = 'A'
	}
	cases := []struct{ name, tok, reason string }{
		{"too long", strings.Repeat("A", MaxPageTokenBytes+1), "too long"},
		{"not base64", "!!!!", "malformed"},
		{"padded base64", paddedToken(t, scope), "malformed"},
		{"std base64 alphabet", strings.NewReplacer("-", "+", "_", "/").Replace(good) + "+/", "malformed"},
		{"not JSON", enc("lease_01"), "malformed"},
		{"wrong version", enc(`{"v":2,"f":"` + tag + `","a":"lease_01"}`), "malformed"},
		{"missing version", enc(`{"f":"` + tag + `","a":"lease_01"}`), "malformed"},
		{"empty cursor", enc(`{"v":1,"f":"` + tag + `","a":""}`), "malformed"},
		{"unknown field", enc(`{"v":1,"f":"` + tag + `","a":"x","p":"*"}`), "malformed"},
		{"trailing data", enc(`{"v":1,"f":"` + tag + `","a":"x"}{}`), "malformed"},
		{"array", enc(`[1]`), "malformed"},
		{"tampered filter tag", enc(`{"v":1,"f":"` + string(flip) + `","a":"lease_01"}`), "does not belong to this filter"},
		{"no filter tag", enc(`{"v":1,"a":"lease_01"}`), "does not belong to this filter"},
		{"raw scope as tag", enc(`{"v":1,"f":"` + "target" + `","a":"lease_01"}`), "does not belong to this filter"},
		{"another filter", EncodePageToken("lease_01", "target\x00"+TargetIndexValue(Identity{TenantID: "t", ProgramID: "p", TargetNamespace: "n", TargetID: "x"})), "does not belong to this filter"},
		{"truncated", good[:len(good)-3], "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodePageToken(tc.tok, scope)
			if got != "" {
				t.Errorf("returned cursor %q", got)
			}
			wantErr(t, err, CodeInvalidRequest, "page_token", tc.reason)
		})
	}
	// Exactly MaxPageTokenBytes is not "too long" (it is merely malformed here).
	_, err := DecodePageToken(strings.Repeat("A", MaxPageTokenBytes), scope)
	wantErr(t, err, CodeInvalidRequest, "page_token", "malformed")
}

// Filter tags separate filters whose scopes share a prefix.
func TestPageTokenFilterTagsDistinct(t *testing.T) {
	scopes := []string{"", "a", "ab", "owner\x00a", "owner\x00ab", "target\x00a", "history\x00" + goldenContractKey}
	seen := map[string]string{}
	for _, s := range scopes {
		tag := filterTag(s)
		if len(tag) != 16 {
			t.Fatalf("tag %q", tag)
		}
		if prev, dup := seen[tag]; dup {
			t.Fatalf("scopes %q and %q share tag %q", prev, s, tag)
		}
		seen[tag] = s
		if _, err := DecodePageToken(EncodePageToken("x", s), s); err != nil {
			t.Fatalf("scope %q: %v", s, err)
		}
	}
}

// paddedToken returns a valid token for scope re-encoded with '=' padding.
func paddedToken(t *testing.T, scope string) string {
	t.Helper()
	for after := "l"; len(after) < 10; after += "x" {
		raw, err := base64.RawURLEncoding.DecodeString(EncodePageToken(after, scope))
		if err != nil {
			t.Fatal(err)
		}
		if p := base64.URLEncoding.EncodeToString(raw); strings.HasSuffix(p, "=") {
			return p
		}
	}
	t.Fatal("no padded form found")
	return ""
}

// Observed design property (not a bug in this package): the cursor inside a
// token is not authenticated, only bound to its filter. A caller can mint a
// token with any cursor for its own filter, so backends must treat the
// decoded cursor as untrusted input that only positions a walk inside the
// filter's own index range.
func TestPageTokenCursorIsCallerControlled(t *testing.T) {
	scope := "owner\x00" + OwnerIndexValue("prn_actor_01")
	forged := base64.RawURLEncoding.EncodeToString([]byte(`{"v":1,"f":"` + filterTag(scope) + `","a":"*\u0000../"}`))
	got, err := DecodePageToken(forged, scope)
	if err != nil || got != "*\x00../" {
		t.Fatalf("forged cursor = %q, %v", got, err)
	}
}
