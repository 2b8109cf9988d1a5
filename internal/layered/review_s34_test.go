package layered

// Review s34: attacks on the layered view, each asserting what a caller
// observes (values read back, cursor walks, errors, Changes).

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// s34Base opens a bbolt file holding content (bucket → key → value) and
// seqs, and returns a read transaction's Base over it (closed at cleanup).
func s34Base(t *testing.T, content map[string]map[string]string, seqs map[string]uint64) (*bbolt.DB, Base) {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "base.db"), 0o600, &bbolt.Options{InitialMmapSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error {
		for b, kv := range content {
			bk, err := tx.CreateBucket([]byte(b))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := bk.Put([]byte(k), []byte(v)); err != nil {
					return err
				}
			}
			if err := bk.SetSequence(seqs[b]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() }) // runs before db.Close
	return db, boltBase{tx}
}

// s34Walk is the bucket's keys and values, "k=v", walked forward and
// backward; it fails the test if the two walks disagree.
func s34Walk(t *testing.T, b *Bucket) []string {
	t.Helper()
	var fwd, back []string
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		fwd = append(fwd, fmt.Sprintf("%s=%s", k, v))
		if len(fwd) > 10000 {
			t.Fatal("forward walk does not end")
		}
	}
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		back = append(back, fmt.Sprintf("%s=%s", k, v))
		if len(back) > 10000 {
			t.Fatal("backward walk does not end")
		}
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) {
		t.Fatalf("walks differ:\n fwd %q\nback %q", fwd, back)
	}
	return fwd
}

func s34WantWalk(t *testing.T, what string, b *Bucket, want ...string) {
	t.Helper()
	if got := s34Walk(t, b); !slices.Equal(got, want) {
		t.Fatalf("%s: walk %q, want %q", what, got, want)
	}
}

func s34Get(t *testing.T, what string, b *Bucket, key, want string, present bool) {
	t.Helper()
	got := b.Get([]byte(key))
	if (got != nil) != present || string(got) != want {
		t.Fatalf("%s: Get(%q) = %q (nil %v), want %q (present %v)", what, key, got, got == nil, want, present)
	}
}

func s34Must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An empty value is a present key (non-nil, empty), in Get, cursors,
// Changes and after Apply to bbolt; an absent key is nil.
func TestReviewS34EmptyValueIsNotAbsent(t *testing.T) {
	db, base := s34Base(t, map[string]map[string]string{"b": {"e": "", "f": "x"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("n"), nil))
	s34Must(t, b.Put([]byte("z"), []byte{}))
	s34Must(t, b.Put([]byte("f"), nil)) // an empty value over a base value
	for _, k := range []string{"e", "f", "n", "z"} {
		s34Get(t, "empty value", b, k, "", true)
	}
	s34Get(t, "absent", b, "a", "", false)
	c := b.Cursor()
	n := 0
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil || len(v) != 0 {
			t.Fatalf("cursor value of %q = %q (nil %v), want empty non-nil", k, v, v == nil)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("walk saw %d keys, want 4", n)
	}
	if k, v := c.Seek([]byte("m")); string(k) != "n" || v == nil {
		t.Fatalf("Seek(m) = %q %q (nil %v)", k, v, v == nil)
	}
	for i, ch := range w.Changes() {
		if ch.Value == nil || ch.Delete || ch.IsSeq {
			t.Fatalf("change %d %+v: a Put of an empty value must have a non-nil Value", i, ch)
		}
	}
	// Apply to the tree: bbolt keeps them as empty values.
	snap := w.Snapshot()
	s34Must(t, db.Update(func(tx *bbolt.Tx) error {
		return snap.Apply(
			func(bk string, k, v []byte) error { return tx.Bucket([]byte(bk)).Put(k, v) },
			func(bk string, k []byte) error { return tx.Bucket([]byte(bk)).Delete(k) },
			func(bk string, s uint64) error { return tx.Bucket([]byte(bk)).SetSequence(s) })
	}))
	s34Must(t, db.View(func(tx *bbolt.Tx) error {
		for _, k := range []string{"e", "f", "n", "z"} {
			if v := tx.Bucket([]byte("b")).Get([]byte(k)); v == nil || len(v) != 0 {
				t.Errorf("bbolt Get(%q) after Apply = %q (nil %v)", k, v, v == nil)
			}
		}
		return nil
	}))
	// Deleting an empty-valued key makes it absent.
	s34Must(t, b.Delete([]byte("z")))
	s34Get(t, "deleted empty value", b, "z", "", false)
}

// Put, Delete and Rollback in every order leave exactly the state at the
// mark: the base value back, no tombstone, no trace in Changes.
func TestReviewS34PutDeleteRollback(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"k": "v0", "m": "m0"}}, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	b := w.Bucket([]byte("b"))
	m0 := w.Mark()
	s34Must(t, b.Put([]byte("k"), []byte("v1")))
	s34Must(t, b.Delete([]byte("k")))
	m1 := w.Mark()
	s34Must(t, b.Put([]byte("k"), []byte("v2")))
	s34Must(t, b.Put([]byte("k"), []byte("v3")))
	s34Must(t, b.Delete([]byte("m")))
	s34Get(t, "before rollback", b, "k", "v3", true)
	w.Rollback(m1)
	s34Get(t, "rolled back to the delete", b, "k", "", false)
	s34Get(t, "rolled back to the delete", b, "m", "m0", true)
	s34WantWalk(t, "rolled back to the delete", b, "m=m0")
	if got := len(w.Changes()); got != 2 {
		t.Fatalf("changes after rollback to m1: %d, want 2", got)
	}
	w.Rollback(m0)
	s34Get(t, "rolled back to the start", b, "k", "v0", true)
	s34WantWalk(t, "rolled back to the start", b, "k=v0", "m=m0")
	if !top.Empty() || len(w.Changes()) != 0 {
		t.Fatalf("after rollback to the start: layer empty %v, changes %+v", top.Empty(), w.Changes())
	}
	// A key absent from the base: Put, Delete, Rollback of only the
	// Delete brings the Put back; rolling back the Put leaves no tombstone.
	mA := w.Mark()
	s34Must(t, b.Put([]byte("new"), []byte("n1")))
	mB := w.Mark()
	s34Must(t, b.Delete([]byte("new")))
	s34Get(t, "put then delete", b, "new", "", false)
	w.Rollback(mB)
	s34Get(t, "delete rolled back", b, "new", "n1", true)
	w.Rollback(mA)
	s34Get(t, "put rolled back", b, "new", "", false)
	if !top.Empty() {
		t.Fatal("a rolled-back Put of a new key left something in the layer")
	}
	// A rollback to the current mark changes nothing.
	s34Must(t, b.Put([]byte("kept"), []byte("1")))
	w.Rollback(w.Mark())
	s34Get(t, "empty rollback", b, "kept", "1", true)
}

// Rollbacks restore sequences, through NextSequence and SetSequence, over
// a base sequence and over an older layer's.
func TestReviewS34RollbackAcrossNextSequence(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}, "c": {}}, map[string]uint64{"b": 5})
	older := NewLayer()
	ow := NewWriter(base, older)
	s34Must(t, ow.Bucket([]byte("c")).SetSequence(40))
	top := NewLayer()
	w := NewWriter(base, top, older)
	b, c := w.Bucket([]byte("b")), w.Bucket([]byte("c"))
	m0 := w.Mark()
	if n, err := b.NextSequence(); err != nil || n != 6 {
		t.Fatalf("NextSequence = %d %v, want 6", n, err)
	}
	m1 := w.Mark()
	if n, err := b.NextSequence(); err != nil || n != 7 {
		t.Fatalf("NextSequence = %d %v, want 7", n, err)
	}
	s34Must(t, b.SetSequence(100))
	if n, _ := c.NextSequence(); n != 41 {
		t.Fatalf("c NextSequence = %d, want 41", n)
	}
	s34Must(t, c.SetSequence(0))
	w.Rollback(m1)
	if b.Sequence() != 6 || c.Sequence() != 40 {
		t.Fatalf("after rollback to m1: b %d c %d, want 6 40", b.Sequence(), c.Sequence())
	}
	w.Rollback(m0)
	if b.Sequence() != 5 || c.Sequence() != 40 {
		t.Fatalf("after rollback to m0: b %d c %d, want 5 40", b.Sequence(), c.Sequence())
	}
	if !top.Empty() {
		t.Fatal("rolled-back sequences left the layer non-empty")
	}
	if n, _ := b.NextSequence(); n != 6 {
		t.Fatalf("NextSequence after rollbacks = %d, want 6", n)
	}
	ch := w.Changes()
	if len(ch) != 1 || !ch[0].IsSeq || ch[0].Seq != 6 || ch[0].Bucket != "b" {
		t.Fatalf("changes %+v, want one SetSequence b 6", ch)
	}
}

// A snapshot does not change whatever the writer does after it: writes
// to the same keys, deletes, rollbacks to marks before and after it,
// sequences, and a second snapshot.
func TestReviewS34SnapshotIsFrozen(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"a": "A0", "c": "C0"}}, map[string]uint64{"b": 1})
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	for i := 0; i < 300; i++ { // enough to split btree nodes
		s34Must(t, b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("v")))
	}
	mBefore := w.Mark()
	s34Must(t, b.Put([]byte("a"), []byte("A1")))
	s34Must(t, b.Delete([]byte("c")))
	_, _ = b.NextSequence()
	r := NewView(base, w.Snapshot())
	rb := r.Bucket([]byte("b"))
	want := s34Walk(t, rb)
	check := func(what string) {
		t.Helper()
		s34Get(t, what, rb, "a", "A1", true)
		s34Get(t, what, rb, "c", "", false)
		if rb.Sequence() != 2 {
			t.Fatalf("%s: snapshot sequence %d, want 2", what, rb.Sequence())
		}
		if got := s34Walk(t, rb); !slices.Equal(got, want) {
			t.Fatalf("%s: the snapshot's walk changed: %d keys, want %d", what, len(got), len(want))
		}
	}
	mAfter := w.Mark()
	for i := 0; i < 300; i += 2 {
		s34Must(t, b.Delete([]byte(fmt.Sprintf("k%03d", i))))
		s34Must(t, b.Put([]byte(fmt.Sprintf("k%03d", i+1)), []byte("changed")))
		s34Must(t, b.Put([]byte(fmt.Sprintf("n%03d", i)), []byte("new")))
	}
	s34Must(t, b.Put([]byte("c"), []byte("C2")))
	s34Must(t, b.SetSequence(99))
	check("after writes")
	w.Rollback(mAfter)
	check("after a rollback to a mark after the snapshot")
	r2 := NewView(base, w.Snapshot())
	w.Rollback(mBefore)
	check("after a rollback to a mark before the snapshot")
	s34Get(t, "writer after rollback", b, "a", "A0", true)
	s34Get(t, "writer after rollback", b, "c", "C0", true)
	// The second snapshot, taken between, is frozen too.
	s34Get(t, "second snapshot", r2.Bucket([]byte("b")), "a", "A1", true)
	s34Get(t, "second snapshot", r2.Bucket([]byte("b")), "c", "", false)
	if got := s34Walk(t, r2.Bucket([]byte("b"))); !slices.Equal(got, want) {
		t.Fatal("the second snapshot differs from the first")
	}
}

// Readers walk snapshots while the writer writes and rolls back (the
// shape the store is built for); run with -race to check the copy on
// write shares no mutable state.
func TestReviewS34SnapshotReadersWhileWriting(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"base": "x"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	for i := 0; i < 200; i++ {
		s34Must(t, b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("0")))
	}
	snap := w.Snapshot()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rb := NewView(base, snap).Bucket([]byte("b"))
			for round := 0; round < 30; round++ {
				n := 0
				c := rb.Cursor()
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if string(v) != "0" && string(v) != "x" {
						errs <- fmt.Errorf("reader saw %q=%q", k, v)
						return
					}
					n++
				}
				if n != 201 {
					errs <- fmt.Errorf("reader walked %d keys, want 201", n)
					return
				}
			}
		}()
	}
	for round := 0; round < 30; round++ {
		m := w.Mark()
		for i := 0; i < 200; i += 3 {
			_ = b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("1"))
			_ = b.Delete([]byte(fmt.Sprintf("k%03d", i+1)))
			_ = b.Put([]byte(fmt.Sprintf("z%03d", i)), []byte("1"))
		}
		if round%2 == 0 {
			w.Rollback(m)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A cursor sees writes made through its view mid-walk: new keys ahead,
// deleted keys skipped (the current one too), keys behind only on Prev,
// and a rollback that removes the key it stands on.
func TestReviewS34CursorWhileWriting(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"a": "1", "c": "1", "e": "1", "g": "1"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	m := w.Mark()
	c := b.Cursor()
	step := func(what string, k []byte, want string) {
		t.Helper()
		if string(k) != want || (want == "" && k != nil) {
			t.Fatalf("%s: %q, want %q", what, k, want)
		}
	}
	k, _ := c.First()
	step("First", k, "a")
	s34Must(t, b.Put([]byte("b"), []byte("2")))
	k, _ = c.Next()
	step("Next after a Put ahead", k, "b")
	s34Must(t, b.Delete([]byte("c")))
	s34Must(t, b.Put([]byte("a0"), []byte("2"))) // behind the cursor
	k, _ = c.Next()
	step("Next over a deleted key", k, "e")
	s34Must(t, b.Delete([]byte("e"))) // the key the cursor is on
	k, _ = c.Next()
	step("Next from a deleted current key", k, "g")
	k, _ = c.Prev()
	step("Prev over the deleted keys", k, "b")
	k, _ = c.Prev()
	step("Prev to a key put behind", k, "a0")
	k, _ = c.Next()
	step("Next", k, "b")
	w.Rollback(m) // b, the current key, is gone; c and e are back
	k, _ = c.Next()
	step("Next after a rollback removed the current key", k, "c")
	k, _ = c.Prev()
	step("Prev after the rollback", k, "a")
	s34Must(t, b.Put([]byte("h"), []byte("2")))
	k, _ = c.Last()
	step("Last sees a new last key", k, "h")
	s34Must(t, b.Delete([]byte("h")))
	s34Must(t, b.Delete([]byte("g")))
	k, _ = c.Next()
	step("Next past deleted last keys", k, "")
	k, _ = c.Prev()
	step("Prev after falling off stays off", k, "")
	// Delete everything: the walk is empty, Seek finds nothing.
	for _, key := range []string{"a", "c", "e"} {
		s34Must(t, b.Delete([]byte(key)))
	}
	if k, _ := c.First(); k != nil {
		t.Fatalf("First of an all-deleted bucket = %q", k)
	}
	if k, _ := c.Last(); k != nil {
		t.Fatalf("Last of an all-deleted bucket = %q", k)
	}
	if k, _ := c.Seek([]byte("a")); k != nil {
		t.Fatalf("Seek in an all-deleted bucket = %q", k)
	}
}

// Keys spread over the base and three layers, the same key in several
// (newest wins, a newer delete hides older values, a newer put revives a
// key an older layer deleted), and seeks to keys before, between, on and
// beyond every layer's keys, with steps from each.
func TestReviewS34ManyLayersSeekAndShadowing(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {
		"a": "base", "d": "base", "g": "base", "k": "base", "x": "base",
	}}, nil)
	// Built oldest first; each writer sees the older layers.
	l3 := NewLayer()
	w3 := NewWriter(base, l3)
	b3 := w3.Bucket([]byte("b"))
	s34Must(t, b3.Put([]byte("k"), []byte("l3")))
	s34Must(t, b3.Put([]byte("b"), []byte("l3")))
	s34Must(t, b3.Delete([]byte("x")))
	s34Must(t, b3.Put([]byte("m"), []byte("l3")))
	l2 := NewLayer()
	w2 := NewWriter(base, l2, l3)
	b2 := w2.Bucket([]byte("b"))
	s34Must(t, b2.Delete([]byte("k")))
	s34Must(t, b2.Put([]byte("x"), []byte("l2"))) // revives a key l3 deleted
	s34Must(t, b2.Delete([]byte("a")))
	s34Must(t, b2.Put([]byte("e"), []byte("l2")))
	s34Must(t, b2.Delete([]byte("zz"))) // absent everywhere
	l1 := NewLayer()
	w1 := NewWriter(base, l1, l2, l3)
	b1 := w1.Bucket([]byte("b"))
	s34Must(t, b1.Put([]byte("k"), []byte("l1"))) // revives what l2 deleted
	s34Must(t, b1.Delete([]byte("m")))
	s34Must(t, b1.Put([]byte("c"), []byte("l1")))
	s34Must(t, b1.Delete([]byte("g")))
	want := []string{"b=l3", "c=l1", "d=base", "e=l2", "k=l1", "x=l2"}
	for _, v := range []*View{w1, NewView(base, l1.snapshot(), l2.snapshot(), l3.snapshot())} {
		bk := v.Bucket([]byte("b"))
		s34WantWalk(t, "four sources", bk, want...)
		for _, g := range []struct {
			k, v string
			ok   bool
		}{{"a", "", false}, {"b", "l3", true}, {"g", "", false}, {"k", "l1", true}, {"m", "", false}, {"x", "l2", true}, {"zz", "", false}} {
			s34Get(t, "four sources", bk, g.k, g.v, g.ok)
		}
		keys := []string{"b", "c", "d", "e", "k", "x"}
		for _, seek := range []string{"", "\x00", "a", "a\x00", "b", "bb", "c", "f", "g", "h", "k", "l", "m", "n", "w", "x", "x\x00", "y", "zz", "\xff"} {
			pos, _ := slices.BinarySearch(keys, seek)
			c := bk.Cursor()
			k, _ := c.Seek([]byte(seek))
			var exp string
			if pos < len(keys) {
				exp = keys[pos]
			}
			if string(k) != exp || (exp == "" && k != nil) {
				t.Fatalf("Seek(%q) = %q, want %q", seek, k, exp)
			}
			if k == nil {
				if k2, _ := c.Prev(); k2 != nil {
					t.Fatalf("Prev after a Seek past the end = %q, want nil", k2)
				}
				continue
			}
			if k, _ := c.Prev(); pos == 0 && k != nil || pos > 0 && string(k) != keys[pos-1] {
				t.Fatalf("Prev after Seek(%q) = %q", seek, k)
			}
			c.Seek([]byte(seek))
			if k, _ := c.Next(); pos+1 >= len(keys) && k != nil || pos+1 < len(keys) && string(k) != keys[pos+1] {
				t.Fatalf("Next after Seek(%q) = %q", seek, k)
			}
		}
	}
}

// Keys that are prefixes of each other, 0x00 and 0xff bytes, and
// MaxKeySize keys sort as bytes.Compare does, split between the base and
// a layer, with deletes of some.
func TestReviewS34PrefixAndEdgeByteKeys(t *testing.T) {
	big0 := strings.Repeat("\x00", MaxKeySize)
	bigF := strings.Repeat("\xff", MaxKeySize)
	bigA := "a" + strings.Repeat("\x00", MaxKeySize-1)
	all := []string{"\x00", "\x00\x00", "\x00\x01", "a", "a\x00", "a\x00\x00", "a\x01", "ab", "abc", "b", "\xfe\xff", "\xff", "\xff\x00", "\xff\xff", "\xff\xff\xff", big0, bigF, bigA}
	baseKV := map[string]string{}
	for i, k := range all {
		if i%2 == 0 {
			baseKV[k] = "base"
		}
	}
	_, base := s34Base(t, map[string]map[string]string{"b": baseKV}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	model := map[string]string{}
	for k, v := range baseKV {
		model[k] = v
	}
	for i, k := range all {
		switch i % 3 {
		case 0:
			s34Must(t, b.Put([]byte(k), []byte("layer")))
			model[k] = "layer"
		case 1:
			s34Must(t, b.Delete([]byte(k)))
			delete(model, k)
		}
	}
	var keys []string
	for k := range model {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y string) int { return bytes.Compare([]byte(x), []byte(y)) })
	var want []string
	for _, k := range keys {
		want = append(want, fmt.Sprintf("%s=%s", k, model[k]))
	}
	s34WantWalk(t, "edge keys", b, want...)
	for _, seek := range append(slices.Clone(all), "", "a\x00\x00\x00", "\xff\xff\xff\xff", "`", bigF+"\x00") {
		pos, _ := slices.BinarySearch(keys, seek)
		k, _ := b.Cursor().Seek([]byte(seek))
		if pos == len(keys) && k != nil || pos < len(keys) && string(k) != keys[pos] {
			t.Fatalf("Seek(%q...) = %q..., want position %d of %d", trunc(seek), trunc(string(k)), pos, len(keys))
		}
	}
	for _, k := range all {
		v, ok := model[k]
		s34Get(t, "edge keys", b, k, v, ok)
	}
}

func trunc(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// Keys and values over the limits are rejected with the documented
// errors and change nothing: no value, no Change, no undo, an empty layer.
func TestReviewS34LimitsRejectAndChangeNothing(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"k": "v"}}, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	b := w.Bucket([]byte("b"))
	over := bytes.Repeat([]byte{'k'}, MaxKeySize+1)
	// A value slice one byte over MaxValueSize, backed by a reserved
	// (never touched) anonymous mapping, so nothing is allocated.
	mem, err := syscall.Mmap(-1, 0, MaxValueSize+1, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	defer syscall.Munmap(mem)
	for _, c := range []struct {
		name string
		err  error
		do   func() error
	}{
		{"Put nil key", ErrKeyRequired, func() error { return b.Put(nil, []byte("v")) }},
		{"Put empty key", ErrKeyRequired, func() error { return b.Put([]byte{}, []byte("v")) }},
		{"Delete nil key", ErrKeyRequired, func() error { return b.Delete(nil) }},
		{"Put oversize key", ErrKeyTooLarge, func() error { return b.Put(over, []byte("v")) }},
		{"Delete oversize key", ErrKeyTooLarge, func() error { return b.Delete(over) }},
		{"Put oversize value", ErrValueTooLarge, func() error { return b.Put([]byte("k"), mem) }},
	} {
		if err := c.do(); !errors.Is(err, c.err) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.err)
		}
		if !top.Empty() || len(w.Changes()) != 0 || w.Mark() != (Mark{}) {
			t.Fatalf("%s: the rejected write left a trace (empty %v, changes %d, mark %+v)", c.name, top.Empty(), len(w.Changes()), w.Mark())
		}
		s34Get(t, c.name, b, "k", "v", true)
		s34Get(t, c.name, b, string(over), "", false)
	}
	// MaxKeySize itself is accepted, read back, and bbolt takes it.
	max := bytes.Repeat([]byte{'m'}, MaxKeySize)
	s34Must(t, b.Put(max, []byte("max")))
	s34Get(t, "MaxKeySize key", b, string(max), "max", true)
	db2, _ := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	s34Must(t, db2.Update(func(tx *bbolt.Tx) error {
		return top.Apply(
			func(bk string, k, v []byte) error { return tx.Bucket([]byte(bk)).Put(k, v) },
			func(bk string, k []byte) error { return tx.Bucket([]byte(bk)).Delete(k) },
			func(bk string, s uint64) error { return tx.Bucket([]byte(bk)).SetSequence(s) })
	}))
}

// A read-only view refuses every write, and its layer stays as it was.
func TestReviewS34ReadOnlyViewRefusesWrites(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"k": "v"}}, map[string]uint64{"b": 3})
	l := NewLayer()
	r := NewView(base, l)
	b := r.Bucket([]byte("b"))
	if err := b.Put([]byte("k"), []byte("x")); err != ErrReadOnly {
		t.Fatalf("Put: %v", err)
	}
	if err := b.Put(nil, nil); err != ErrReadOnly {
		t.Fatalf("Put of an invalid key to a read-only view: %v, want ErrReadOnly", err)
	}
	if err := b.Delete([]byte("k")); err != ErrReadOnly {
		t.Fatalf("Delete: %v", err)
	}
	if err := b.SetSequence(9); err != ErrReadOnly {
		t.Fatalf("SetSequence: %v", err)
	}
	if _, err := b.NextSequence(); err != ErrReadOnly {
		t.Fatalf("NextSequence: %v", err)
	}
	if !l.Empty() || len(r.Changes()) != 0 {
		t.Fatal("a refused write reached the layer")
	}
	s34Get(t, "read-only", b, "k", "v", true)
	if b.Sequence() != 3 {
		t.Fatalf("sequence %d, want 3", b.Sequence())
	}
}

// Apply of a layer holding deletes of keys the base lacks, puts, and
// sequences leaves the tree equal to the view; buckets only in layers read
// through a view with no base.
func TestReviewS34ApplyAndLayerOnlyBuckets(t *testing.T) {
	content := map[string]map[string]string{"a": {"1": "x", "2": "x"}, "b": {"1": "y"}}
	db, base := s34Base(t, content, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	a, b := w.Bucket([]byte("a")), w.Bucket([]byte("b"))
	s34Must(t, a.Delete([]byte("absent")))
	s34Must(t, a.Delete([]byte("1")))
	s34Must(t, a.Put([]byte("3"), []byte("z")))
	s34Must(t, b.Put([]byte("0"), []byte("y0")))
	s34Must(t, b.Delete([]byte("never")))
	_, _ = b.NextSequence()
	wantA, wantB := s34Walk(t, a), s34Walk(t, b)
	var order []string
	s34Must(t, db.Update(func(tx *bbolt.Tx) error {
		return top.Apply(
			func(bk string, k, v []byte) error {
				order = append(order, bk+"/"+string(k))
				return tx.Bucket([]byte(bk)).Put(k, v)
			},
			func(bk string, k []byte) error {
				order = append(order, bk+"/"+string(k))
				return tx.Bucket([]byte(bk)).Delete(k)
			},
			func(bk string, s uint64) error { return tx.Bucket([]byte(bk)).SetSequence(s) })
	}))
	// Key order within each bucket.
	for _, bk := range []string{"a/", "b/"} {
		var in []string
		for _, o := range order {
			if strings.HasPrefix(o, bk) {
				in = append(in, o)
			}
		}
		if !slices.IsSorted(in) {
			t.Fatalf("Apply order within %s: %q", bk, in)
		}
	}
	tx, err := db.Begin(false)
	s34Must(t, err)
	defer tx.Rollback()
	applied := NewView(boltBase{tx})
	if got := s34Walk(t, applied.Bucket([]byte("a"))); !slices.Equal(got, wantA) {
		t.Fatalf("bucket a after Apply %q, want %q", got, wantA)
	}
	if got := s34Walk(t, applied.Bucket([]byte("b"))); !slices.Equal(got, wantB) {
		t.Fatalf("bucket b after Apply %q, want %q", got, wantB)
	}
	if s := applied.Bucket([]byte("b")).Sequence(); s != 1 {
		t.Fatalf("sequence after Apply %d", s)
	}
	// The same layer with no base: its buckets are there, others are not.
	nb := NewView(nil, top.snapshot())
	if nb.Bucket([]byte("zzz")) != nil {
		t.Fatal("a bucket in no layer and no base exists")
	}
	lb := nb.Bucket([]byte("a"))
	if lb == nil {
		t.Fatal("a bucket held only by a layer is missing")
	}
	s34WantWalk(t, "layer-only bucket", lb, "3=z")
	s34Get(t, "layer-only bucket", lb, "1", "", false)
	if k, _ := lb.Cursor().Seek([]byte("4")); k != nil {
		t.Fatalf("Seek past a layer-only bucket's keys = %q", k)
	}
	if s := nb.Bucket([]byte("b")).Sequence(); s != 1 {
		t.Fatalf("layer-only sequence %d, want 1", s)
	}
}

// The caller's key and value buffers are its own again once Put, Delete
// or Seek returns: reusing them changes nothing in the view or in Changes.
func TestReviewS34CallerBuffersReused(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"base1": "v", "base2": "v"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	kb, vb := []byte("key1"), []byte("val1")
	s34Must(t, b.Put(kb, vb))
	copy(kb, "key2")
	copy(vb, "val2")
	s34Must(t, b.Put(kb, vb))
	copy(kb, "base")
	s34Must(t, b.Delete(kb)) // "base", absent
	kb = append(kb[:0], "base1"...)
	s34Must(t, b.Delete(kb))
	copy(kb, "XXXXX")
	copy(vb, "XXXX")
	s34WantWalk(t, "after buffer reuse", b, "base2=v", "key1=val1", "key2=val2")
	ch := w.Changes()
	var got []string
	for _, c := range ch {
		got = append(got, fmt.Sprintf("%s %q %q %v", c.Bucket, c.Key, c.Value, c.Delete))
	}
	want := []string{`b "key1" "val1" false`, `b "key2" "val2" false`, `b "base" "" true`, `b "base1" "" true`}
	if !slices.Equal(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
	seek := []byte("key1")
	c := b.Cursor()
	if k, _ := c.Seek(seek); string(k) != "key1" {
		t.Fatalf("Seek = %q", k)
	}
	copy(seek, "aaaa")
	if k, _ := c.Next(); string(k) != "key2" {
		t.Fatalf("Next after the seek buffer changed = %q", k)
	}
}

// Changes lists the surviving writes in order after nested rollbacks.
func TestReviewS34ChangesAfterRollbacks(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"a": {}, "b": {}}, nil)
	w := NewWriter(base, NewLayer())
	a, b := w.Bucket([]byte("a")), w.Bucket([]byte("b"))
	s34Must(t, a.Put([]byte("1"), []byte("one")))
	outer := w.Mark()
	s34Must(t, b.Put([]byte("2"), []byte("two")))
	inner := w.Mark()
	s34Must(t, a.Delete([]byte("1")))
	_, _ = b.NextSequence()
	w.Rollback(inner)
	s34Must(t, b.Delete([]byte("3")))
	w.Rollback(outer)
	s34Must(t, a.Put([]byte("4"), []byte("four")))
	_, _ = a.NextSequence()
	m := w.Mark()
	s34Must(t, a.Put([]byte("5"), []byte("x")))
	w.Rollback(m)
	var got []string
	for _, c := range w.Changes() {
		got = append(got, fmt.Sprintf("%s %s %s %v %v %d", c.Bucket, c.Key, c.Value, c.Delete, c.IsSeq, c.Seq))
	}
	want := []string{"a 1 one false false 0", "a 4 four false false 0", "a   false true 1"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes\n%q\nwant\n%q", got, want)
	}
	s34WantWalk(t, "a", a, "1=one", "4=four")
	s34WantWalk(t, "b", b)
	// Reset: the next Changes starts after; a rollback to a fresh mark
	// keeps what came before the Reset.
	w.Reset()
	if len(w.Changes()) != 0 {
		t.Fatal("changes after Reset")
	}
	m = w.Mark()
	s34Must(t, a.Delete([]byte("4")))
	w.Rollback(m)
	s34WantWalk(t, "after Reset and rollback", a, "1=one", "4=four")
}

// DEFECT (if it fails): the slice Changes returned before a Reset must
// still hold those writes after the next writes (the committer encodes
// the batch's record from it), but Reset truncates in place and the next
// writes overwrite the same backing array.
func TestReviewS34ChangesHeldAcrossReset(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("batch1"), []byte("v1")))
	batch1 := w.Changes()
	w.Reset()
	s34Must(t, b.Put([]byte("batch2"), []byte("v2")))
	if string(batch1[0].Key) != "batch1" || string(batch1[0].Value) != "v1" {
		t.Fatalf("the first batch's Changes now read %q=%q: the second batch's write overwrote it", batch1[0].Key, batch1[0].Value)
	}
}

// DEFECT (if it fails): Reset documents that "no Rollback goes before"
// the writes made so far. A Mark taken before the Reset must then roll
// back at most to the Reset point: all writes after the Reset go, the
// ones before stay. Instead the mark's stale indexes are applied to the
// new undo log: with fewer writes since the Reset it panics (slice
// bounds), with more it undoes only some of them.
func TestReviewS34RollbackToMarkFromBeforeReset(t *testing.T) {
	t.Run("fewer writes since Reset", func(t *testing.T) {
		_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
		w := NewWriter(base, NewLayer())
		b := w.Bucket([]byte("b"))
		s34Must(t, b.Put([]byte("0"), []byte("1")))
		m := w.Mark() // {1,1}
		s34Must(t, b.Put([]byte("a"), []byte("1")))
		w.Reset()
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("Rollback to a mark from before Reset panicked: %v", p)
				}
			}()
			w.Rollback(m)
		}()
		s34WantWalk(t, "writes before the Reset", b, "0=1", "a=1")
	})
	t.Run("more writes since Reset", func(t *testing.T) {
		_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
		w := NewWriter(base, NewLayer())
		b := w.Bucket([]byte("b"))
		s34Must(t, b.Put([]byte("a"), []byte("1")))
		m := w.Mark() // {1,1}
		s34Must(t, b.Put([]byte("b"), []byte("1")))
		w.Reset()
		s34Must(t, b.Put([]byte("c"), []byte("1")))
		s34Must(t, b.Put([]byte("d"), []byte("1")))
		w.Rollback(m)
		s34WantWalk(t, "rolled back to a mark before the Reset", b, "a=1", "b=1")
		if n := len(w.Changes()); n != 0 {
			t.Fatalf("Changes after the rollback: %+v, want none", w.Changes())
		}
	})
}

// Apply stops at the first error and returns it.
func TestReviewS34ApplyStopsAtFirstError(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	b := w.Bucket([]byte("b"))
	for _, k := range []string{"1", "2", "3"} {
		s34Must(t, b.Put([]byte(k), []byte("v")))
	}
	_, _ = b.NextSequence()
	boom := errors.New("boom")
	var calls []string
	err := top.Apply(
		func(bk string, k, v []byte) error {
			calls = append(calls, string(k))
			if string(k) == "2" {
				return boom
			}
			return nil
		},
		func(string, []byte) error { return nil },
		func(string, uint64) error { calls = append(calls, "seq"); return nil })
	if err != boom || !slices.Equal(calls, []string{"1", "2"}) {
		t.Fatalf("Apply: %v after %q, want boom after [1 2]", err, calls)
	}
}
