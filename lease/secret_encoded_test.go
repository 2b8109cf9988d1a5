package lease

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestSecretShapedEncodedKeyIsAKnownLimit records a documented limit of the
// secret screen (README, "Redaction"): SecretShaped recognises a key only in
// its literal form, so the same key base64-encoded (as in a Basic header or
// a config dump) passes the metadata screen and the audit redactor. It is
// skipped, not deleted: the assertions say what a fix must achieve.
func TestSecretShapedEncodedKeyIsAKnownLimit(t *testing.T) {
	t.Skip("known limit, documented in the README: base64-encoded keys are not recognised by SecretShaped")
	key := "star_sk_v1_01J00000000000000000000000_" + strings.Repeat("ab", 32)
	for _, v := range []string{
		base64.StdEncoding.EncodeToString([]byte(key)),
		base64.StdEncoding.EncodeToString([]byte("svc:" + key)), // Basic auth
	} {
		if !SecretShaped(v) {
			if err := ValidateMetadata(Metadata{"note": v}); err == nil {
				t.Errorf("metadata holding an encoded API key is accepted: %q", v)
			}
		}
	}
}
