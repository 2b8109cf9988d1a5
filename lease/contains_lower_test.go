package lease

import (
	"math/rand"
	"strings"
	"testing"
)

// containsLower answers what strings.Contains(strings.ToLower(v), word)
// answers, for ASCII values and for ones that only fold to the word
// outside ASCII (the Kelvin sign lowers to k).
func TestContainsLowerIsContainsOfToLower(t *testing.T) {
	words := []string{"star_sk_", "bearer "}
	cases := []string{"", "star_sk_", "STAR_SK_", "xStAr_Sk_y", "star_s", "star_sk", "tar_sk_", "Bearer abc",
		"BEARER", "bearer", "xbearer y", "star_s\u212a_", "STAR_S\u212a_x", "b\u00e9arer ", "\u0130star_sk_", "star_sk_\xff"}
	alphabet := []string{"s", "S", "t", "T", "a", "A", "r", "R", "_", "k", "K", "b", "B", "e", "E", " ", "\u212a", "\u0130", "x", "\xff"}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.Intn(14); n > 0; n-- {
			b.WriteString(alphabet[rng.Intn(len(alphabet))])
			if rng.Intn(8) == 0 { // a word, in random case, sometimes cut or with a Kelvin sign
				w := words[rng.Intn(len(words))]
				w = w[:len(w)-rng.Intn(2)]
				for _, c := range w {
					switch {
					case c == 'k' && rng.Intn(3) == 0:
						b.WriteString("\u212a")
					case rng.Intn(2) == 0:
						b.WriteString(strings.ToUpper(string(c)))
					default:
						b.WriteRune(c)
					}
				}
			}
		}
		cases = append(cases, b.String())
	}
	found := 0
	for _, v := range cases {
		for _, w := range words {
			want := strings.Contains(strings.ToLower(v), w)
			if got := containsLower(v, w); got != want {
				t.Fatalf("containsLower(%q, %q) = %v, want %v", v, w, got, want)
			}
			if want {
				found++
			}
		}
	}
	if found < 1000 {
		t.Fatalf("only %d cases contain a word: the test compares almost nothing", found)
	}
}
