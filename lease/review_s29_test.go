package lease

// Review s29: attacks on Identity.hashesTo (the 64-slot memo of sound
// tuples behind Record.validate) and on containsLower.

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
	"unsafe"
)

// oldValidateTuple is Record.validate's tuple check at 29bf262.
func s29OldTupleErr(r *Record) error {
	id := r.Identity()
	if f, ok := id.isCanonical(); !ok {
		return Invalid(f, "stored tuple is not canonical")
	}
	if id.lockKeyOfCanonical() != r.LockKey {
		return Invalid("lock_key", "stored tuple does not hash to lock_key")
	}
	return nil
}

func s29ErrText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// The lock key behind a remembered tuple is a copy: a caller whose
// lock-key string points into a buffer it then rewrites (same length, to
// another tuple's key) cannot make the memo vouch for the first tuple
// under the second key.
func TestReviewS29HashesToCopiesTheLockKey(t *testing.T) {
	a := validRecord().Identity()
	a.TargetID = "s29-target-a-lockkey"
	b := a
	b.TargetID = "s29-target-b-lockkey"
	ka, kb := a.lockKeyOfCanonical(), b.lockKeyOfCanonical()
	if len(ka) != len(kb) {
		t.Fatal("lock keys differ in length")
	}
	buf := []byte(ka)
	alias := unsafe.String(&buf[0], len(buf))
	if _, ok := a.hashesTo(alias); !ok {
		t.Fatal("sound tuple refused")
	}
	copy(buf, kb) // the memo's lock key would now read kb if it aliased buf
	if f, ok := a.hashesTo(kb); ok || f != "lock_key" {
		t.Fatalf("tuple a accepted under b's lock key after the caller rewrote its buffer: %q %v", f, ok)
	}
}

// Every identifier component of a remembered tuple is a copy too (the
// shipped test covers target_id only): rewrite each field's buffer.
func TestReviewS29HashesToCopiesEveryField(t *testing.T) {
	base := validRecord().Identity()
	for i := range base.fields() {
		id := base
		f := id.fields()[i]
		val := "s29-field-" + fmt.Sprint(i) + "-aaaa"
		buf := []byte(val)
		*f.v = unsafe.String(&buf[0], len(buf))
		key := id.lockKeyOfCanonical()
		if _, ok := id.hashesTo(key); !ok {
			t.Fatalf("%s: sound tuple refused", f.name)
		}
		buf[len(buf)-1] = 'b' // another canonical tuple, same headers
		if want, _ := uncached(id, key); want != "lock_key" {
			t.Fatalf("%s: edit should change the hash", f.name)
		}
		if _, ok := id.hashesTo(key); ok {
			t.Fatalf("%s: a tuple rewritten in the caller's buffer was taken from memory", f.name)
		}
	}
}

// Non-canonical spellings of a remembered sound tuple (case, whitespace,
// NFD, compatibility forms) under the very lock key the canonical tuple
// hashes to are refused, with the field 29bf262 named.
func TestReviewS29NonCanonicalTwinOfRememberedTuple(t *testing.T) {
	r := validRecord()
	cid := Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "café-01", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
	r.SetIdentity(cid)
	r.LockKey = cid.lockKeyOfCanonical()
	if err := r.validate(); err != nil {
		t.Fatalf("canonical record refused: %v", err)
	}
	twins := []func(*Record){
		func(r *Record) { r.TenantID = "Tenant-main" },
		func(r *Record) { r.TenantID = " tenant-main" },
		func(r *Record) { r.TargetID = "cafe\u0301-01" }, // NFD
		func(r *Record) { r.TargetID = "CAFÉ-01" },
		func(r *Record) { r.ActorName = "usernamegen\t" },
		func(r *Record) { r.WorkflowName = "" },
		func(r *Record) { r.OperationClass = "DEFAULT" },
		func(r *Record) { r.ProgramID = "program-\u212a" }, // Kelvin sign
	}
	for i, mut := range twins {
		for round := 0; round < 3; round++ {
			_ = r.validate() // the canonical tuple is remembered
			tw := *r
			mut(&tw)
			got, want := tw.validate(), s29OldTupleErr(&tw)
			if got == nil || s29ErrText(got) != s29ErrText(want) {
				t.Fatalf("twin %d: validate = %v; 29bf262 gives %v", i, got, want)
			}
		}
	}
}

// Slot collisions: tuples whose lock keys pick the same slot, alternated
// and crossed (each tuple with the others' keys), always answer as the
// uncached check does; and empty or short lock keys are refused.
func TestReviewS29SlotCollisionsAndShortKeys(t *testing.T) {
	bySlot := map[int][]Identity{}
	base := validRecord().Identity()
	for i := 0; len(bySlot[5]) < 6 && i < 100000; i++ {
		id := base
		id.TargetID = fmt.Sprintf("s29-coll-%d", i)
		k := id.lockKeyOfCanonical()
		bySlot[tupleSlot(k)] = append(bySlot[tupleSlot(k)], id)
	}
	ids := bySlot[5]
	if len(ids) < 6 {
		t.Fatal("no collisions found")
	}
	for round := 0; round < 4; round++ {
		for _, a := range ids {
			for _, b := range ids {
				k := b.lockKeyOfCanonical()
				wf, wok := uncached(a, k)
				if f, ok := a.hashesTo(k); f != wf || ok != wok {
					t.Fatalf("hashesTo(%s, key of %s) = %q %v; want %q %v", a.TargetID, b.TargetID, f, ok, wf, wok)
				}
			}
		}
	}
	var zero Identity
	for _, k := range []string{"", "s", "st", KeyPrefix, base.lockKeyOfCanonical()[:10]} {
		for _, id := range []Identity{zero, base} {
			wf, wok := uncached(id, k)
			if f, ok := id.hashesTo(k); ok || f != wf || ok != wok {
				t.Fatalf("hashesTo(%+v, %q) = %q %v; want %q %v", id, k, f, ok, wf, wok)
			}
		}
	}
}

// Random tuples (valid and not: case, spaces, non-ASCII, "..", control
// characters, over-long) checked by many goroutines through
// Record.validate agree with 29bf262's check, error text included.
func TestReviewS29ValidateAgreesWithUncachedUnderConcurrency(t *testing.T) {
	pieces := []string{"a", "B", "é", "e\u0301", " ", "..", ".", "-", "\x00", "ß", "\u212a", "İ", "x", "0", "\xff", strings.Repeat("z", 250)}
	rng := rand.New(rand.NewSource(29))
	var recs []*Record
	for i := 0; i < 400; i++ {
		r := validRecord()
		id := r.Identity()
		f := id.fields()[rng.Intn(7)]
		var sb strings.Builder
		for n := 1 + rng.Intn(3); n > 0; n-- {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		*f.v = sb.String()
		canon := id
		cok := true
		for _, cf := range canon.fields() {
			n, err := NormalizeIdentifier(cf.name, *cf.v)
			if err != nil {
				cok = false
				break
			}
			*cf.v = n
		}
		switch rng.Intn(3) {
		case 0:
			r.SetIdentity(id) // lock key of the raw tuple (canonical or not)
			r.LockKey = id.lockKeyOfCanonical()
		case 1: // the raw tuple under its canonical form's lock key
			r.SetIdentity(id)
			r.LockKey = canon.lockKeyOfCanonical()
		default:
			r.SetIdentity(canon)
			r.LockKey = canon.lockKeyOfCanonical()
		}
		_ = cok
		recs = append(recs, r)
	}
	sound := 0
	for _, r := range recs {
		if s29OldTupleErr(r) == nil {
			sound++
		}
	}
	if sound < 50 || sound > len(recs)-50 {
		t.Fatalf("%d of %d records sound: the mix is not exercising both sides", sound, len(recs))
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 0; n < 10; n++ {
				for i := range recs {
					r := recs[(i*11+g*17+n)%len(recs)]
					got := r.validate()
					want := s29OldTupleErr(r)
					var ie *Error
					if want != nil && (got == nil || s29ErrText(got) != s29ErrText(want)) {
						t.Errorf("validate(%+v) = %v; 29bf262 %v", r.Identity(), got, want)
						return
					}
					if want == nil && got != nil && errors.As(got, &ie) && (ie.Field == "lock_key" || isTupleField(ie.Field)) {
						t.Errorf("validate refused a sound tuple: %v", got)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
}

func isTupleField(f string) bool {
	var id Identity
	for _, x := range id.fields() {
		if x.name == f {
			return true
		}
	}
	return false
}

// containsLower agrees with strings.Contains(strings.ToLower(v), word) for
// every input: exhaustively over short strings of an alphabet with the
// letters of both words in both cases, Unicode case-folding traps (Kelvin
// sign, dotted I, long s, sharp s), invalid UTF-8 and overlaps; and on
// random byte strings.
func TestReviewS29ContainsLowerAgrees(t *testing.T) {
	words := []string{"star_sk_", "bearer ", "", "s", "ss"}
	alpha := []string{"s", "S", "t", "T", "a", "A", "r", "R", "_", "k", "K", "b", "B", "e", "E", " ",
		"\u212a", "\u017f", "İ", "ß", "\xff", "\xe2\x84", "ſ", "Ａ"}
	check := func(v string) {
		for _, w := range words {
			if got, want := containsLower(v, w), strings.Contains(strings.ToLower(v), w); got != want {
				t.Fatalf("containsLower(%q, %q) = %v, strings.Contains(ToLower) = %v", v, w, got, want)
			}
		}
	}
	var rec func(prefix string, depth int)
	rec = func(prefix string, depth int) {
		check(prefix)
		if depth == 0 {
			return
		}
		for _, a := range alpha {
			rec(prefix+a, depth-1)
		}
	}
	rec("", 4)
	for _, v := range []string{"STAR_SK_", "xStAr_Sk_y", "star_star_sk_", "sstar_sk_", "BEARER x", "bearerbearer ",
		"BEARER\u00a0", "STAR_S\u212a_", "\xffSTAR_SK_", "STAR_SK", "bEaReR ", "star_sk_\x00"} {
		check(v)
	}
	rng := rand.New(rand.NewSource(2929))
	for i := 0; i < 200000; i++ {
		b := make([]byte, rng.Intn(24))
		for j := range b {
			switch rng.Intn(4) {
			case 0:
				b[j] = "starSTARK_kbeBE r"[rng.Intn(17)]
			default:
				b[j] = byte(rng.Intn(256))
			}
		}
		check(string(b))
		if utf8.Valid(b) {
			check(strings.ToUpper(string(b)))
		}
	}
	// And through the callers.
	for _, v := range []string{"xSTAR_SK_y", "Bearer abc", "STAR_S\u212a_", "BEARER "} {
		if !SecretShaped(v) {
			t.Fatalf("SecretShaped(%q) = false", v)
		}
		if CheckOpaqueID("lease_id", v) == nil {
			t.Fatalf("CheckOpaqueID accepted %q", v)
		}
	}
	if SecretShaped("ok-id") {
		t.Fatal("SecretShaped(ok-id)")
	}
}
