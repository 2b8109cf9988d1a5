package lease

import (
	"fmt"
	"sync"
	"testing"
	"unsafe"
)

// uncached is the check hashesTo remembers the result of.
func uncached(id Identity, lockKey string) (string, bool) {
	if f, ok := id.isCanonical(); !ok {
		return f, false
	}
	if id.lockKeyOfCanonical() != lockKey {
		return "lock_key", false
	}
	return "", true
}

// A remembered tuple vouches for exactly its eight strings: a tuple that
// differs in any one component, or the same tuple with another lock key,
// is checked afresh and refused.
func TestHashesToRemembersOnlyTheExactTuple(t *testing.T) {
	r := validRecord()
	id := r.Identity()
	if f, ok := id.hashesTo(r.LockKey); !ok {
		t.Fatalf("a valid record's tuple refused at %s", f)
	}
	if f, ok := id.hashesTo(r.LockKey); !ok { // now from memory
		t.Fatalf("refused from memory at %s", f)
	}
	for i := range id.fields() {
		other := id
		f := other.fields()[i]
		*f.v += "x" // canonical still, another tuple
		if got, ok := other.hashesTo(r.LockKey); ok || got != "lock_key" {
			t.Errorf("%s changed: hashesTo = %q, %v; want lock_key, false", f.name, got, ok)
		}
		orig := id
		*f.v = " " + *orig.fields()[i].v // not canonical
		if got, ok := other.hashesTo(r.LockKey); ok || got != f.name {
			t.Errorf("%s not canonical: hashesTo = %q, %v", f.name, got, ok)
		}
	}
	if _, ok := id.hashesTo(r.LockKey[:len(r.LockKey)-1] + "A"); ok {
		t.Error("the tuple was taken with another lock key")
	}
	if _, ok := id.hashesTo(r.LockKey); !ok {
		t.Error("the tuple is refused after the others")
	}
}

// The memory holds copies: a caller that reuses the buffer behind its
// strings does not change what was found sound.
func TestHashesToKeepsCopies(t *testing.T) {
	id := validRecord().Identity()
	buf := []byte("target-only-this-test-checks")
	id.TargetID = unsafe.String(&buf[0], len(buf))
	lockKey := id.lockKeyOfCanonical()
	if _, ok := id.hashesTo(lockKey); !ok {
		t.Fatal("valid tuple refused")
	}
	buf[0] ^= 1 // same length, another target, under the same string header
	if want, _ := uncached(id, lockKey); want != "lock_key" {
		t.Fatalf("the edit should make another tuple, got %q", want)
	}
	if _, ok := id.hashesTo(lockKey); ok {
		t.Fatal("a tuple changed in the caller's buffer was taken from memory")
	}
}

// Concurrent checks of many tuples, sound and not, colliding in the
// slots, each give what the uncached check gives (run with -race).
func TestHashesToConcurrent(t *testing.T) {
	type tc struct {
		id      Identity
		lockKey string
	}
	var cases []tc
	for i := 0; i < 300; i++ {
		r := validRecord()
		id := r.Identity()
		id.TargetID = fmt.Sprintf("t-%d", i)
		key := id.lockKeyOfCanonical()
		cases = append(cases, tc{id, key})
		if i%3 == 0 {
			cases = append(cases, tc{id, cases[0].lockKey}) // sound tuple, someone else's key
		}
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 0; n < 20; n++ {
				for i := range cases {
					c := cases[(i*7+g*13+n)%len(cases)]
					wf, wok := uncached(c.id, c.lockKey)
					if f, ok := c.id.hashesTo(c.lockKey); f != wf || ok != wok {
						t.Errorf("hashesTo(%s, %s) = %q, %v; want %q, %v", c.id.TargetID, c.lockKey, f, ok, wf, wok)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
}
