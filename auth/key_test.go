package auth

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestKeyRoundTrip(t *testing.T) {
	for range 50 {
		id, err := NewCredentialID(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		secret, err := NewSecret()
		if err != nil {
			t.Fatal(err)
		}
		key := FormatKey(id, secret)
		if len(key) != KeyLen || !strings.HasPrefix(key, "star_sk_v1_") {
			t.Fatalf("key %d chars, prefix %q", len(key), key[:11])
		}
		if strings.ToUpper(id) != id || len(id) != 26 {
			t.Fatalf("credential id %q is not an upper-case ULID", id)
		}
		gotID, gotSecret, err := ParseKey(key)
		if err != nil || gotID != id || gotSecret != secret {
			t.Fatalf("ParseKey(FormatKey) = %q, %v", gotID, err)
		}
		if h := key[len(key)-64:]; h != strings.ToLower(h) || h != hex.EncodeToString(secret[:]) {
			t.Fatal("secret is not 64 lower-case hex characters")
		}
	}
}

func TestParseKeyRejects(t *testing.T) {
	const id = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
	sec := strings.Repeat("0123456789abcdef", 4)
	good := "star_sk_v1_" + id + "_" + sec
	if _, _, err := ParseKey(good); err != nil {
		t.Fatalf("good key rejected: %v", err)
	}
	cases := map[string]string{
		"empty":              "",
		"prefix only":        "star_sk_v1_",
		"wrong version":      "star_sk_v2_" + id + "_" + sec,
		"upper prefix":       "STAR_SK_V1_" + id + "_" + sec,
		"other prefix":       "star_pk_v1_" + id + "_" + sec,
		"lower-case id":      "star_sk_v1_" + strings.ToLower(id) + "_" + sec,
		"id with I":          "star_sk_v1_01ARZ3NDEKTSV4RRFFQ69G5FAI_" + sec,
		"id with U":          "star_sk_v1_01ARZ3NDEKTSV4RRFFQ69G5FAU_" + sec,
		"id overflow":        "star_sk_v1_81ARZ3NDEKTSV4RRFFQ69G5FAV_" + sec,
		"short id":           "star_sk_v1_" + id[1:] + "_" + sec + "0",
		"long id":            "star_sk_v1_" + id + "0_" + sec[1:],
		"dash separator":     "star_sk_v1_" + id + "-" + sec,
		"upper hex":          "star_sk_v1_" + id + "_" + strings.ToUpper(sec),
		"non-hex":            "star_sk_v1_" + id + "_" + sec[:63] + "g",
		"short secret":       "star_sk_v1_" + id + "_" + sec[:62],
		"long secret":        good + "00",
		"trailing newline":   good + "\n",
		"leading space":      " " + good,
		"trailing space":     good + " ",
		"base64 secret":      "star_sk_v1_" + id + "_" + strings.Repeat("A", 43) + "=",
		"unicode":            "star_sk_v1_" + id + "_" + sec[:62] + "é",
		"nul":                "star_sk_v1_" + id + "_" + sec[:63] + "\x00",
		"bearer scheme kept": "Bearer " + good,
	}
	for name, in := range cases {
		_, _, err := ParseKey(in)
		if err != ErrMalformedKey {
			t.Errorf("%s: ParseKey = %v, want ErrMalformedKey", name, err)
		}
		if in != "" && err != nil && strings.Contains(err.Error(), in) {
			t.Errorf("%s: error contains the input", name)
		}
		if err != nil && strings.Contains(err.Error(), sec[:16]) {
			t.Errorf("%s: error contains secret material", name)
		}
	}
}

func TestSecretRedacted(t *testing.T) {
	s, _ := NewSecret()
	h := hex.EncodeToString(s[:])
	js, _ := json.Marshal(s)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %x %X %s %q %d", s, s, s, s, s, s, s, s), s.String(), string(js)} {
		if strings.Contains(out, h) || strings.Contains(out, h[:8]) {
			t.Fatalf("secret printed: %s", out)
		}
	}
	if b := s.Bytes(); hex.EncodeToString(b) != h {
		t.Fatal("Bytes lost the secret")
	}
	if !errors.Is(ErrMalformedKey, ErrMalformedKey) {
		t.Fatal()
	}
}
