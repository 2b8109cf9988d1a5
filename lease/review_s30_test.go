package lease

// Review of 8375b69: containsLower rules a value out when it lacks the
// word's first non-[a-z] byte. That is sound only if no byte of
// strings.ToLower(v) below utf8.RuneSelf other than a to z can appear
// without the same byte in v. These tests check that premise exhaustively
// over Unicode and over invalid UTF-8, and compare containsLower with
// strings.Contains(strings.ToLower(v), w) on generated values.

import (
	"math/rand"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

var s30Words = []string{"star_sk_", "bearer ", "", "_", " ", "a_b", "x y", "abc", "k", "sk_", "_x_",
	"__", "  ", "r_", "9", "-", ".", "\x00", "\x7f", "a\x00", "star_sk_v1_"}

func s30Check(t *testing.T, v, w string) bool {
	t.Helper()
	want := strings.Contains(strings.ToLower(v), w)
	if got := containsLower(v, w); got != want {
		t.Fatalf("containsLower(%+q, %+q) = %v, strings.Contains(strings.ToLower(v), w) = %v", v, w, got, want)
	}
	return want
}

// The premise, per code point: strings.ToLower maps each rune on its own
// (invalid bytes become U+FFFD), so it suffices that no rune lowers to a
// string holding an ASCII byte other than a to z that the rune's own
// encoding lacks. Every valid code point, including the Kelvin sign
// (U+212A -> k) and dotted capital I (U+0130 -> i), is checked, and each is
// also put in front of, inside and after both words.
func TestReviewS30EveryRuneKeepsNonLetterASCII(t *testing.T) {
	toASCII := 0
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		s := string(r)
		l := strings.ToLower(s)
		for i := 0; i < len(l); i++ {
			c := l[i]
			if c >= utf8.RuneSelf {
				continue
			}
			if r >= utf8.RuneSelf {
				toASCII++ // a non-ASCII rune lowering to ASCII
				if c < 'a' || c > 'z' {
					t.Fatalf("U+%04X lowers to %q: ASCII non-letter %q from a rune without it", r, l, c)
				}
			} else if strings.IndexByte(s, c) < 0 && (c < 'a' || c > 'z') {
				t.Fatalf("%q lowers to %q: new non-letter byte %q", s, l, c)
			}
		}
		if r%7 == 0 || r < 0x3000 || r >= 0x1E900 && r < 0x1EA00 || l != s && utf8.RuneLen([]rune(l)[0]) == 1 {
			for _, v := range []string{s, s + "tar_sk_", "star" + s + "sk_", "STAR_S" + s + "_", "bearer" + s,
				"beare" + s + " ", s + "bearer ", "star_sk" + s, "_" + s + "_"} {
				s30Check(t, v, "star_sk_")
				s30Check(t, v, "bearer ")
				s30Check(t, v, "_")
			}
		}
	}
	// unicode.ToLower sends U+212A to k and U+0130 to i; the check above
	// must have seen those (a guard that the loop really ran).
	if toASCII < 2 {
		t.Fatalf("saw %d non-ASCII runes lowering to ASCII, want at least the Kelvin sign and U+0130", toASCII)
	}
}

// Every string of one and two bytes (all 65,792, valid or not), and the
// same bytes inside the words, against every word.
func TestReviewS30AllShortByteStrings(t *testing.T) {
	buf := make([]byte, 0, 2)
	for a := 0; a < 256; a++ {
		for _, w := range s30Words {
			s30Check(t, string([]byte{byte(a)}), w)
		}
		for b := 0; b < 256; b++ {
			buf = append(buf[:0], byte(a), byte(b))
			v := string(buf)
			for _, w := range s30Words {
				s30Check(t, v, w)
			}
			s30Check(t, "STAR"+v+"SK_", "star_sk_")
			s30Check(t, "BEARER"+v, "bearer ")
		}
	}
}

// Random values over bytes that matter (upper and lower letters of the
// words, the anchors, invalid bytes, look-alikes, lone continuation bytes),
// with the words planted in random case, sometimes broken.
func TestReviewS30RandomValues(t *testing.T) {
	pieces := []string{"s", "S", "t", "T", "a", "A", "r", "R", "k", "K", "b", "B", "e", "E", "x", "X", "y",
		"_", " ", "\x00", "\x7f", "-", ".", "9", "\xff", "\x80", "\xc3", "\xe2\x84", "\u212a", "\u0130", "\u017f",
		"\uff3f", "\u3000", "\u00a0", "\u2009", "\ufe4f", "\u02cd", "\ufffd", "\U0001E900", "\u0131", "\u03a3"}
	rng := rand.New(rand.NewSource(30))
	hits := map[string]int{}
	for i := 0; i < 40000; i++ {
		var b strings.Builder
		for n := rng.Intn(16); n > 0; n-- {
			switch rng.Intn(10) {
			case 0:
				b.WriteByte(byte(rng.Intn(256)))
			case 1:
				w := s30Words[rng.Intn(len(s30Words))]
				for j := 0; j < len(w); j++ {
					if rng.Intn(2) == 0 {
						b.WriteString(strings.ToUpper(w[j : j+1]))
					} else {
						b.WriteByte(w[j])
					}
				}
			default:
				b.WriteString(pieces[rng.Intn(len(pieces))])
			}
		}
		v := b.String()
		for _, w := range s30Words {
			if s30Check(t, v, w) {
				hits[w]++
			}
		}
	}
	for _, w := range []string{"star_sk_", "bearer ", "_", " ", "a_b", "x y", "abc", "_x_"} {
		if hits[w] < 50 {
			t.Fatalf("only %d values contain %q: the comparison tests almost nothing", hits[w], w)
		}
	}
}

// SecretShaped and CheckOpaqueID on keys and bearer values whose separator
// or letters are replaced by non-ASCII look-alikes. strings.ToLower leaves
// every such separator non-ASCII, so none of these holds "star_sk_" after
// lower-casing, and the answers must be the ones the slow form gives; the
// Kelvin sign does lower to k, so star_s\u212a_ must still be caught.
func TestReviewS30LookAlikeSecrets(t *testing.T) {
	const tail = "v1_01HZX3K9Q8W7E6R5T4Y3U2I1O0_"
	for _, tc := range []struct {
		v      string
		secret bool
	}{
		{"star_sk_" + tail, true},
		{"STAR_S\u212a_" + tail, true},  // Kelvin sign lowers to k
		{"\u0130star_sk_" + tail, true}, // U+0130 in front
		{"star_sk_\xff" + tail, true},   // invalid byte after
		{"\xffSTAR_SK_", true},
		{"Bearer\x20abc", true},
		{"BEARER \u212a", true},
		{"b\u0130arer x", false},             // U+0130 lowers to i, not e
		{"star\uff3fsk\uff3f" + tail, false}, // fullwidth low line
		{"star\u02cdsk\u02cd" + tail, false}, // modifier low macron
		{"star\ufe4fsk\ufe4f" + tail, false}, // wavy low line
		{"bearer\u00a0abc", false},           // no-break space
		{"bearer\u3000abc", false},           // ideographic space
		{"bearer\u2009abc", false},           // thin space
		{"bearer\xa0abc", false},             // lone continuation byte
		{"star\xdfsk\xdf", false},            // invalid bytes (become U+FFFD)
		{"\u017ftar_sk_", false},             // long s lowers to itself, not s
	} {
		want := strings.Contains(strings.ToLower(tc.v), "star_sk_") || strings.Contains(strings.ToLower(tc.v), "bearer ")
		if want != tc.secret {
			t.Fatalf("test table wrong for %q: slow form says %v", tc.v, want)
		}
		if got := SecretShaped(tc.v); got != tc.secret {
			t.Fatalf("SecretShaped(%+q) = %v, want %v", tc.v, got, tc.secret)
		}
	}
	// CheckOpaqueID: ASCII ids holding a key in any case are refused for
	// the key; ids with look-alikes are refused by the charset.
	for _, id := range []string{"xstar_sk_" + tail, "a.STAR_SK_x", "a-StAr_Sk_", "0star_sk_"} {
		err := CheckOpaqueID("id", id)
		if err == nil || !strings.Contains(err.Error(), "star_sk_") {
			t.Fatalf("CheckOpaqueID(%q) = %v, want the API key refusal", id, err)
		}
	}
	for _, id := range []string{"xSTAR_S\u212a_" + tail, "star\uff3fsk\uff3f", "a\u0130star_sk_"} {
		if err := CheckOpaqueID("id", id); err == nil {
			t.Fatalf("CheckOpaqueID(%q) accepted an id with non-ASCII look-alikes", id)
		}
	}
	for _, id := range []string{"star-sk-1", "star.sk.1", "starsk_1", "a_b_c", "STAR_S"} {
		if err := CheckOpaqueID("id", id); err != nil {
			t.Fatalf("CheckOpaqueID(%q) = %v, want accepted", id, err)
		}
	}
}
