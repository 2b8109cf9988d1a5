package lease

import (
	"strings"
	"testing"
)

// s40CheckSame fails when the one-pass check and the rules one by one
// disagree on v (in either direction: a fast "false" is harmless only
// because CheckOpaqueID falls back, but a fast "true" the slow path
// refuses lets a bad id through).
func s40CheckSame(t testing.TB, v string) {
	t.Helper()
	fast, slow := opaqueIDOK(v), opaqueIDFault("x", v) == nil
	if fast && !slow {
		t.Fatalf("%q: one pass accepts, rules one by one refuse: %v", v, opaqueIDFault("x", v))
	}
	if fast != slow {
		t.Fatalf("%q: one pass %v, rules one by one %v", v, fast, slow)
	}
	if got := CheckOpaqueID("x", v); (got == nil) != slow {
		t.Fatalf("%q: CheckOpaqueID %v, slow valid=%v", v, got, slow)
	}
}

// s40KeyVariants is "star_sk_" in every ASCII letter case, plus forms with
// Unicode letters that fold or lower-case to s/k (U+017F LONG S, U+212A
// KELVIN SIGN) and with '_' replaced by its neighbours.
func s40KeyVariants() []string {
	var out []string
	letters := []byte("starsk")
	for m := 0; m < 1<<len(letters); m++ {
		b := make([]byte, len(letters))
		for i, c := range letters {
			if m&(1<<i) != 0 {
				c -= 'a' - 'A'
			}
			b[i] = c
		}
		out = append(out, string(b[:4])+"_"+string(b[4:])+"_")
	}
	out = append(out,
		"\u017ftar_sk_", "star_\u017fk_", "star_s\u212a_", "\u017ftar_\u017f\u212a_",
		"star-sk_", "star_sk-", "star.sk_", "star:sk_", "star__sk_", "starsk_", "star_sk",
		"star_star_sk_", "sstar_sk_", "star_sk_sk_", "star_s_sk_", "sta_star_sk_",
		"star\x00sk_", "star_sk\x00", "st\u0430r_sk_", // Cyrillic a
	)
	return out
}

// Exhaustive over a 15-symbol alphabet of each rule's edge bytes up to
// length 5 (~820k strings).
func TestS40OpaqueIDExhaustiveSmall(t *testing.T) {
	alphabet := []string{"a", "Z", "9", "s", "k", ".", "_", ":", "-", "/", "\x00", "\x7f", "\x80", "\xff", "\u212a"}
	var walk func(prefix string, n int)
	walk = func(prefix string, n int) {
		s40CheckSame(t, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			walk(prefix+c, n-1)
		}
	}
	walk("", 5)
}

// Every byte 0..255 at every position of short ids, and at index 0, 1,
// 255, 256 (and past) of ids around the length bound.
func TestS40OpaqueIDEveryByteEveryPosition(t *testing.T) {
	for _, base := range []string{"a", "ab", "abc", "a.b", "a_b", "x.", "star_sk", "tar_sk_", strings.Repeat("k", 255), strings.Repeat("k", 256), strings.Repeat("k", 257)} {
		for pos := 0; pos <= len(base); pos++ {
			for c := 0; c < 256; c++ {
				s40CheckSame(t, base[:pos]+string([]byte{byte(c)})+base[pos:])
				if pos < len(base) {
					s40CheckSame(t, base[:pos]+string([]byte{byte(c)})+base[pos+1:])
				}
			}
		}
	}
}

// Every case/Unicode variant of the key prefix, at every offset of ids
// with various fillers and lengths around 256, truncated at both ends.
func TestS40OpaqueIDKeyPrefixEverywhere(t *testing.T) {
	fillers := []string{"a", "A", "0", "s", "_", "-", ":", "a.", "star", "_sk_", "star_"}
	for _, k := range s40KeyVariants() {
		for _, fill := range fillers {
			for _, total := range []int{len(k), len(k) + 1, len(k) + 3, 20, 255, 256, 257} {
				for at := 0; at+len(k) <= total+len(k); at++ {
					pre := strings.Repeat(fill, at/len(fill)+1)[:at]
					v := pre + k
					for len(v) < total {
						v += fill
					}
					s40CheckSame(t, v)
					for cut := 1; cut < len(k) && cut < len(v); cut++ {
						s40CheckSame(t, v[:len(v)-cut])
						s40CheckSame(t, v[cut:])
					}
					if at > 260 {
						break
					}
				}
			}
		}
	}
}

// Random ids over a biased alphabet, many with a planted key prefix.
func TestS40OpaqueIDRandom(t *testing.T) {
	alphabet := []string{"a", "Z", "9", "s", "S", "t", "T", "a", "A", "r", "R", "k", "K", ".", "_", ":", "-", "_", "\x00", "\xff", "\u212a", "\u017f", " "}
	keys := s40KeyVariants()
	seed := uint64(0x9e3779b97f4a7c15)
	rnd := func(n int) int {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	n := 200_000
	if testing.Short() {
		n = 100_000
	}
	for i := 0; i < n; i++ {
		var b strings.Builder
		l := rnd(24)
		if rnd(50) == 0 {
			l = 250 + rnd(10)
		}
		for b.Len() < l {
			if rnd(6) == 0 {
				b.WriteString(keys[rnd(len(keys))])
			} else {
				b.WriteString(alphabet[rnd(len(alphabet))])
			}
		}
		s40CheckSame(t, b.String())
	}
}

func FuzzS40OpaqueIDFastPath(f *testing.F) {
	for _, k := range s40KeyVariants() {
		f.Add(k)
		f.Add("a" + k)
		f.Add("a." + k + "x")
	}
	for _, s := range []string{"", "a", ".", "a..b", "a.b", "_a", "a\x00", "a\xff", "a\u212a", strings.Repeat("k", 256), strings.Repeat("k", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) { s40CheckSame(t, v) })
}
