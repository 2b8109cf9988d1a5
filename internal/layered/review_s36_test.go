package layered

// Review s36 (commit "fewer allocations on the committer's path"): attacks
// on pointer items shared by snapshots, the View's reused lookup probe,
// its bucket cache, and the one buffer a key and its value now share.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// s36Kept is a slice the view returned, with what it held then: it must
// hold the same bytes for good (a later write, rollback or snapshot must
// not reach it).
type s36Kept struct {
	what string
	got  []byte
	want string
}

func s36CheckKept(t *testing.T, when string, kept []s36Kept) {
	t.Helper()
	for _, k := range kept {
		if string(k.got) != k.want {
			t.Fatalf("%s: a slice returned earlier (%s) changed: %q, was %q", when, k.what, k.got, k.want)
		}
	}
}

// s36Dump is every key and value of bucket name in v, forward, as
// "k=v" (values quoted so an empty one shows), or nil if v lacks it.
func s36Dump(t *testing.T, v *View, name string) []string {
	t.Helper()
	b := v.Bucket([]byte(name))
	if b == nil {
		return nil
	}
	return s36Walk(t, b)
}

// s36Walk walks b forward and backward (they must agree) and checks
// every key's Get against the walk.
func s36Walk(t *testing.T, b *Bucket) []string {
	t.Helper()
	var fwd, back []string
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			t.Fatalf("cursor gave a nil value for %q", k)
		}
		fwd = append(fwd, fmt.Sprintf("%q=%q", k, v))
		if g := b.Get(k); g == nil || !bytes.Equal(g, v) {
			t.Fatalf("Get(%q) = %q (nil %v), cursor %q", k, g, g == nil, v)
		}
		if len(fwd) > 10000 {
			t.Fatal("walk does not end")
		}
	}
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		back = append(back, fmt.Sprintf("%q=%q", k, v))
		if len(back) > 10000 {
			t.Fatal("walk does not end")
		}
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) {
		t.Fatalf("walks differ:\n fwd %q\nback %q", fwd, back)
	}
	return fwd
}

func s36ModelDump(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%q=%q", k, m[k]))
	}
	return out
}

func s36Equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// The caller's key and value buffers are its own once Put returns, also
// when they overlap each other (one buffer for both now).
func TestReviewS36PutCopiesOverlappingBuffers(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	buf := []byte("abcdefgh")
	s34Must(t, b.Put(buf[:3], buf[3:6]))  // "abc" = "def"
	s34Must(t, b.Put(buf[2:5], buf[0:4])) // "cde" = "abcd"
	s34Must(t, b.Put(buf[4:8], buf[4:8])) // "efgh" = "efgh"
	s34Must(t, b.Put(buf[1:2], buf[1:1])) // "b" = ""
	snap := w.Snapshot()
	for i := range buf {
		buf[i] = 'X'
	}
	buf = append(buf[:0], "zzzzzzzzzzzzzzzz"...)
	_ = buf
	want := []string{`"abc"="def"`, `"b"=""`, `"cde"="abcd"`, `"efgh"="efgh"`}
	s36Equal(t, "after the caller reused its buffer", s36Walk(t, b), want)
	s36Equal(t, "snapshot", s36Dump(t, NewView(base, snap), "b"), want)
	var ch []string
	for _, c := range w.Changes() {
		ch = append(ch, fmt.Sprintf("%q=%q/%v", c.Key, c.Value, c.Value == nil))
	}
	s36Equal(t, "Changes", ch, []string{`"abc"="def"/false`, `"cde"="abcd"/false`, `"efgh"="efgh"/false`, `"b"=""/false`})
}

// Appending to a key or value the view returned (Get, a cursor, Changes)
// never writes over the value or key that shares its buffer, nor over
// another item.
func TestReviewS36AppendToReturnedSlices(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"base": "bv"}}, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("k1"), []byte("value-one")))
	s34Must(t, b.Put([]byte("k2"), []byte("")))
	s34Must(t, b.Put([]byte("k3"), []byte("v3")))
	s34Must(t, b.Delete([]byte("k4")))
	want := []string{`"base"="bv"`, `"k1"="value-one"`, `"k2"=""`, `"k3"="v3"`}
	snap := w.Snapshot()

	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		_ = append(k, "KEYTAIL-KEYTAIL"...)
		_ = append(v, "VALTAIL"...)
		_ = append(k, '!')
		_ = append(v, '!')
	}
	for _, k := range []string{"k1", "k2", "k3"} {
		v := b.Get([]byte(k))
		_ = append(v, "GETTAIL-GETTAIL"...)
		_ = append(v, '!')
	}
	for _, ch := range w.Changes() {
		_ = append(ch.Key, "CHANGEKEYTAIL"...)
		_ = append(ch.Key, '!')
		if ch.Value != nil {
			_ = append(ch.Value, "CHANGEVALTAIL"...)
		}
	}
	s36Equal(t, "after appends to returned slices", s36Walk(t, b), want)
	s36Equal(t, "snapshot after appends", s36Dump(t, NewView(base, snap), "b"), want)
	// Changes' keys and values are intact too.
	var ch []string
	for _, c := range w.Changes() {
		ch = append(ch, fmt.Sprintf("%q=%q/%v", c.Key, c.Value, c.Delete))
	}
	s36Equal(t, "Changes after appends", ch, []string{`"k1"="value-one"/false`, `"k2"=""/false`, `"k3"="v3"/false`, `"k4"=""/true`})
	// And a value's tail capacity is not its neighbour's key: appending
	// to a Get of k1 and then reading k2, k3 gives their own bytes.
	v1 := b.Get([]byte("k1"))
	if cap(v1) > len(v1) {
		// Writing into spare capacity must not land in another item.
		ext := v1[:cap(v1)]
		for i := len(v1); i < len(ext); i++ {
			ext[i] = '#'
		}
	}
	s36Equal(t, "after writing a value's spare capacity", s36Walk(t, b), want)
}

// A value Get returned keeps its bytes after the key is overwritten,
// deleted, rolled back and overwritten again; snapshots between those
// writes keep theirs.
func TestReviewS36ReturnedValueAndSnapshotsSurviveRewrites(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"k": "base"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	var kept []s36Kept
	keep := func(what string) {
		v := b.Get([]byte("k"))
		kept = append(kept, s36Kept{what, v, string(v)})
	}
	type snapAt struct {
		l    *Layer
		want []string
	}
	var snaps []snapAt
	take := func() { snaps = append(snaps, snapAt{w.Snapshot(), s36Dump(t, w, "b")}) }
	keep("base")
	take()
	m0 := w.Mark()
	s34Must(t, b.Put([]byte("k"), []byte("one")))
	keep("one")
	take()
	m1 := w.Mark()
	s34Must(t, b.Put([]byte("k"), []byte("two-longer")))
	keep("two")
	take()
	s34Must(t, b.Delete([]byte("k")))
	if v := b.Get([]byte("k")); v != nil {
		t.Fatalf("deleted key reads %q", v)
	}
	take()
	s34Must(t, b.Put([]byte("k"), nil))
	keep("empty")
	take()
	w.Rollback(m1)
	s34Get(t, "rolled back to one", b, "k", "one", true)
	keep("one again")
	take()
	s34Must(t, b.Put([]byte("k"), []byte("three")))
	take()
	w.Rollback(m0)
	s34Get(t, "rolled back to base", b, "k", "base", true)
	take()
	s34Must(t, b.Put([]byte("k"), []byte("four")))
	take()
	s36CheckKept(t, "end", kept)
	for i, s := range snaps {
		s36Equal(t, fmt.Sprintf("snapshot %d", i), s36Dump(t, NewView(base, s.l), "b"), s.want)
	}
	wantSeq := [][]string{{`"k"="base"`}, {`"k"="one"`}, {`"k"="two-longer"`}, nil, {`"k"=""`}, {`"k"="one"`}, {`"k"="three"`}, {`"k"="base"`}, {`"k"="four"`}}
	for i, s := range snaps {
		s36Equal(t, fmt.Sprintf("snapshot %d against the script", i), s.want, wantSeq[i])
	}
}

// Rollback restores each exact earlier value after many overwrites of
// one key (values of every length, empty among them), one mark at a time.
func TestReviewS36RollbackThroughManyOverwrites(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {"x": "basex"}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	const n = 200
	marks := make([]Mark, n)
	snaps := make([]*Layer, n)
	vals := make([]string, n)
	present := make([]bool, n)
	cur, has := "", false
	for i := 0; i < n; i++ {
		marks[i], vals[i], present[i] = w.Mark(), cur, has
		snaps[i] = w.Snapshot()
		switch {
		case i%17 == 5:
			s34Must(t, b.Delete([]byte("k")))
			cur, has = "", false
		case i%7 == 3:
			s34Must(t, b.Put([]byte("k"), []byte{}))
			cur, has = "", true
		default:
			v := bytes.Repeat([]byte{byte('a' + i%26)}, i%40)
			v = append(v, fmt.Sprint(i)...)
			s34Must(t, b.Put([]byte("k"), v))
			cur, has = string(v), true
		}
		if i%5 == 0 {
			s34Must(t, b.Put([]byte("x"), []byte(fmt.Sprint("x", i))))
		}
	}
	for i := n - 1; i >= 0; i-- {
		w.Rollback(marks[i])
		s34Get(t, fmt.Sprint("rollback to mark ", i), b, "k", vals[i], present[i])
		if len(w.Changes()) != marks[i].changes {
			t.Fatalf("Changes after rollback to %d: %d, want %d", i, len(w.Changes()), marks[i].changes)
		}
		sv := NewView(base, snaps[i]).Bucket([]byte("b"))
		s34Get(t, fmt.Sprint("snapshot ", i), sv, "k", vals[i], present[i])
		if d1, d2 := s36Walk(t, b), s36Walk(t, sv); !slices.Equal(d1, d2) {
			t.Fatalf("mark %d: view %q, snapshot taken there %q", i, d1, d2)
		}
	}
	s36Equal(t, "all rolled back", s36Walk(t, b), []string{`"x"="basex"`})
	if len(w.Changes()) != 0 {
		t.Fatalf("Changes after rolling everything back: %d", len(w.Changes()))
	}
}

// An empty value is a put (non-nil, empty) in Get, cursors, snapshots and
// Changes, and a rollback of a delete over it restores it non-nil.
func TestReviewS36EmptyValueIsAPut(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("nil"), nil))
	s34Must(t, b.Put([]byte("empty"), []byte{}))
	s34Must(t, b.Put([]byte("sliced"), []byte("abc")[3:]))
	for _, k := range []string{"nil", "empty", "sliced"} {
		s34Get(t, "empty value", b, k, "", true)
	}
	for i, c := range w.Changes() {
		if c.Delete || c.IsSeq || c.Value == nil || len(c.Value) != 0 {
			t.Fatalf("Change %d of an empty put: %+v (value nil %v)", i, c, c.Value == nil)
		}
	}
	snap := w.Snapshot()
	m := w.Mark()
	for _, k := range []string{"nil", "empty", "sliced"} {
		s34Must(t, b.Delete([]byte(k)))
		s34Get(t, "deleted", b, k, "", false)
	}
	w.Rollback(m)
	for _, k := range []string{"nil", "empty", "sliced"} {
		s34Get(t, "rolled back delete", b, k, "", true)
		s34Get(t, "snapshot", NewView(base, snap).Bucket([]byte("b")), k, "", true)
	}
	c := b.Cursor()
	n := 0
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			t.Fatalf("cursor value of %q is nil", k)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("cursor saw %d keys", n)
	}
}

// A cursor keeps its place while Gets (which reuse the view's probe) run
// between its moves, also Gets of keys a layer holds and keys only the
// base holds, absent keys, and a Seek of another cursor.
func TestReviewS36CursorBetweenGets(t *testing.T) {
	content := map[string]map[string]string{"b": {"b1": "B1", "b3": "B3", "b5": "B5", "b7": "B7"}}
	_, base := s34Base(t, content, nil)
	older := NewLayer()
	{
		ow := NewWriter(base, older)
		ob := ow.Bucket([]byte("b"))
		s34Must(t, ob.Put([]byte("b2"), []byte("O2")))
		s34Must(t, ob.Delete([]byte("b5")))
		s34Must(t, ob.Put([]byte("b6"), []byte("O6")))
	}
	top := NewLayer()
	w := NewWriter(base, top, older.Snapshot())
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("b3"), []byte("T3")))
	s34Must(t, b.Put([]byte("b4"), []byte("T4")))
	s34Must(t, b.Delete([]byte("b6")))
	want := []string{"b1=B1", "b2=O2", "b3=T3", "b4=T4", "b7=B7"}
	getAll := func() {
		for _, k := range []string{"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b33", "a", "z"} {
			b.Get([]byte(k))
		}
	}
	other := b.Cursor()
	c := b.Cursor()
	var got []string
	for k, v := c.First(); k != nil; k, v = c.Next() {
		got = append(got, string(k)+"="+string(v))
		getAll()
		other.Seek([]byte("b0"))
		other.Last()
	}
	if !slices.Equal(got, want) {
		t.Fatalf("forward with Gets between: %q, want %q", got, want)
	}
	got = nil
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		got = append(got, string(k)+"="+string(v))
		getAll()
		other.Seek([]byte("b9"))
	}
	slices.Reverse(got)
	if !slices.Equal(got, want) {
		t.Fatalf("backward with Gets between: %q, want %q", got, want)
	}
	// Seek, a Get of another key, a write (which repositions the cursor
	// from its key), another Get, then Next and Prev.
	seek := []byte("b3")
	k, v := c.Seek(seek)
	seek[1] = '9' // the caller's seek buffer is its own again
	if string(k) != "b3" || string(v) != "T3" {
		t.Fatalf("Seek(b3) = %q=%q", k, v)
	}
	b.Get([]byte("b7"))
	s34Must(t, b.Put([]byte("b35"), []byte("T35")))
	b.Get([]byte("b1"))
	if k, v := c.Next(); string(k) != "b35" || string(v) != "T35" {
		t.Fatalf("Next after Get, Put, Get = %q=%q, want b35=T35", k, v)
	}
	b.Get([]byte("b0"))
	if k, _ := c.Next(); string(k) != "b4" {
		t.Fatalf("Next = %q, want b4", k)
	}
	b.Get([]byte("b9"))
	s34Must(t, b.Delete([]byte("b35")))
	b.Get([]byte("b2"))
	if k, v := c.Prev(); string(k) != "b3" || string(v) != "T3" {
		t.Fatalf("Prev after a delete of the key before = %q=%q, want b3=T3", k, v)
	}
	m := w.Mark()
	s34Must(t, b.Put([]byte("b25"), []byte("T25")))
	b.Get([]byte("b7"))
	w.Rollback(m)
	b.Get([]byte("b1"))
	if k, v := c.Prev(); string(k) != "b2" || string(v) != "O2" {
		t.Fatalf("Prev after a rolled back put = %q=%q, want b2=O2", k, v)
	}
}

// Two cursors of one view, moved alternately, with writes between: each
// walks the bucket as if alone.
func TestReviewS36NestedCursors(t *testing.T) {
	content := map[string]map[string]string{"b": {}}
	for i := 0; i < 40; i += 2 {
		content["b"][fmt.Sprintf("k%02d", i)] = "base"
	}
	_, base := s34Base(t, content, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	for i := 1; i < 40; i += 4 {
		s34Must(t, b.Put([]byte(fmt.Sprintf("k%02d", i)), []byte("top")))
	}
	all := func() []string {
		var ks []string
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			ks = append(ks, string(k))
		}
		return ks
	}
	want := all()
	// Outer forward, inner backward from the end down to the outer key.
	outer := b.Cursor()
	var pairs int
	for ko, _ := outer.First(); ko != nil; ko, _ = outer.Next() {
		inner := b.Cursor()
		var seen []string
		for ki, _ := inner.Last(); ki != nil && bytes.Compare(ki, ko) >= 0; ki, _ = inner.Prev() {
			seen = append(seen, string(ki))
			b.Get(ki)
		}
		i := slices.Index(want, string(ko))
		exp := slices.Clone(want[i:])
		slices.Reverse(exp)
		if !slices.Equal(seen, exp) {
			t.Fatalf("inner walk from the end to %q: %q, want %q", ko, seen, exp)
		}
		pairs++
	}
	if pairs != len(want) {
		t.Fatalf("outer walk saw %d keys, want %d", pairs, len(want))
	}
	// Two cursors stepping alternately while the view is written: each
	// step is checked against the keys as they are then.
	model := map[string]bool{}
	for _, k := range want {
		model[k] = true
	}
	next := func(from string, fwd bool) string {
		best := ""
		for k := range model {
			if fwd && k > from && (best == "" || k < best) || !fwd && k < from && (best == "" || k > best) {
				best = k
			}
		}
		return best
	}
	r := rand.New(rand.NewPCG(36, 36))
	c1, c2 := b.Cursor(), b.Cursor()
	k1, _ := c1.First()
	k2, _ := c2.Last()
	p1, p2 := string(k1), string(k2)
	for step := 0; step < 400 && p1 != "" && p2 != ""; step++ {
		if r.IntN(3) == 0 {
			k := fmt.Sprintf("k%02d", r.IntN(42))
			if r.IntN(2) == 0 {
				s34Must(t, b.Put([]byte(k), []byte("w")))
				model[k] = true
			} else {
				s34Must(t, b.Delete([]byte(k)))
				delete(model, k)
			}
		}
		fwd := r.IntN(2) == 0
		if step%2 == 0 {
			var k []byte
			if fwd {
				k, _ = c1.Next()
			} else {
				k, _ = c1.Prev()
			}
			if exp := next(p1, fwd); string(k) != exp {
				t.Fatalf("step %d: c1 from %q (fwd %v) = %q, want %q", step, p1, fwd, k, exp)
			}
			p1 = string(k)
			if p1 == "" {
				k, _ = c1.Seek([]byte("k20"))
				p1 = string(k)
			}
		} else {
			var k []byte
			if fwd {
				k, _ = c2.Next()
			} else {
				k, _ = c2.Prev()
			}
			if exp := next(p2, fwd); string(k) != exp {
				t.Fatalf("step %d: c2 from %q (fwd %v) = %q, want %q", step, p2, fwd, k, exp)
			}
			p2 = string(k)
			if p2 == "" {
				k, _ = c2.Seek([]byte("k10"))
				p2 = string(k)
			}
		}
	}
}

// The view's buckets: one only the base has, one only a layer has (the
// writer's base lacks it), one nobody has (nil at every call, also after
// writes elsewhere); the name slice is the caller's again; a name that is
// a prefix of another is another bucket.
func TestReviewS36BucketCache(t *testing.T) {
	// A layer holding bucket "c" (made over a base that has it).
	_, baseC := s34Base(t, map[string]map[string]string{"c": {"c0": "base-of-other-file"}, "a": {}}, nil)
	older := NewLayer()
	ow := NewWriter(baseC, older)
	s34Must(t, ow.Bucket([]byte("c")).Put([]byte("c1"), []byte("L1")))
	s34Must(t, ow.Bucket([]byte("c")).Put([]byte("c2"), []byte("L2")))
	s34Must(t, ow.Bucket([]byte("a")).Put([]byte("a1"), []byte("LA1")))

	// The writer's base has "a", "ab" and "b" but not "c".
	_, base := s34Base(t, map[string]map[string]string{"a": {"a0": "A0"}, "ab": {"x": "AB"}, "b": {"b0": "B0"}}, nil)
	w := NewWriter(base, NewLayer(), older.Snapshot())
	name := []byte("a")
	a := w.Bucket(name)
	name[0] = 'b'
	if got := w.Bucket(name); got == nil || got == a {
		t.Fatalf("Bucket(b) after Bucket(a) with the same buffer = %p (a is %p)", got, a)
	}
	s36Equal(t, "a", s36Walk(t, w.Bucket([]byte("a"))), []string{`"a0"="A0"`, `"a1"="LA1"`})
	s36Equal(t, "b", s36Walk(t, w.Bucket([]byte("b"))), []string{`"b0"="B0"`})
	s36Equal(t, "ab", s36Walk(t, w.Bucket([]byte("ab"))), []string{`"x"="AB"`})
	if w.Bucket([]byte("a\x00")) != nil || w.Bucket([]byte("")) != nil || w.Bucket(nil) != nil {
		t.Fatal("a bucket no one has exists")
	}
	c := w.Bucket([]byte("c"))
	if c == nil {
		t.Fatal("the layer-only bucket is missing")
	}
	s36Equal(t, "c (layer only)", s36Walk(t, c), []string{`"c1"="L1"`, `"c2"="L2"`})
	s34Must(t, c.Put([]byte("c3"), []byte("T3")))
	s34Must(t, c.Delete([]byte("c1")))
	s34Must(t, w.Bucket([]byte("c")).Put([]byte("c0"), []byte("T0")))
	for i := 0; i < 3; i++ {
		if w.Bucket([]byte("d")) != nil {
			t.Fatal("bucket d exists")
		}
		s34Must(t, w.Bucket([]byte("a")).Put([]byte(fmt.Sprint("n", i)), []byte("x")))
	}
	s36Equal(t, "c after writes", s36Walk(t, w.Bucket([]byte("c"))), []string{`"c0"="T0"`, `"c2"="L2"`, `"c3"="T3"`})
	if s := w.Bucket([]byte("c")).Sequence(); s != 0 {
		t.Fatalf("layer-only bucket sequence %d", s)
	}
	if _, err := w.Bucket([]byte("c")).NextSequence(); err != nil {
		t.Fatal(err)
	}
	w.Reset()
	if s := w.Bucket([]byte("c")).Sequence(); s != 1 {
		t.Fatalf("layer-only bucket sequence after Reset %d", s)
	}
	// A reader of the same layers over the same base sees the same.
	r := NewView(base, w.Snapshot(), older.Snapshot())
	s36Equal(t, "reader c", s36Dump(t, r, "c"), []string{`"c0"="T0"`, `"c2"="L2"`, `"c3"="T3"`})
	if r.Bucket([]byte("d")) != nil {
		t.Fatal("reader: bucket d exists")
	}
	// A view over no base at all.
	nb := NewView(nil, older.Snapshot())
	s36Equal(t, "no base, c", s36Dump(t, nb, "c"), []string{`"c1"="L1"`, `"c2"="L2"`})
	if nb.Bucket([]byte("b")) != nil {
		t.Fatal("no base: bucket b exists")
	}
}

// Changes copied out before a rollback keep their keys and values after
// later writes take their places, and Changes after rollbacks are the
// surviving writes in order.
func TestReviewS36ChangesAcrossRollbacks(t *testing.T) {
	_, base := s34Base(t, map[string]map[string]string{"b": {}}, nil)
	w := NewWriter(base, NewLayer())
	b := w.Bucket([]byte("b"))
	s34Must(t, b.Put([]byte("k1"), []byte("v1")))
	m := w.Mark()
	s34Must(t, b.Put([]byte("k2"), []byte("v2")))
	s34Must(t, b.Delete([]byte("k1")))
	s34Must(t, b.Put([]byte("k3"), []byte{}))
	copied := slices.Clone(w.Changes())
	var kept []s36Kept
	for i, c := range copied {
		kept = append(kept, s36Kept{fmt.Sprint("change key ", i), c.Key, string(c.Key)})
		if c.Value != nil {
			kept = append(kept, s36Kept{fmt.Sprint("change value ", i), c.Value, string(c.Value)})
		}
	}
	w.Rollback(m)
	for i := 0; i < 50; i++ {
		s34Must(t, b.Put([]byte("k2"), []byte(fmt.Sprint("again-", i))))
		s34Must(t, b.Put([]byte(fmt.Sprint("z", i)), bytes.Repeat([]byte{'q'}, i)))
	}
	s36CheckKept(t, "after rollback and rewrites", kept)
	got := w.Changes()
	if len(got) != 101 || string(got[0].Key) != "k1" || string(got[0].Value) != "v1" || got[0].Delete {
		t.Fatalf("Changes after rollback: %d, first %+v", len(got), got[0])
	}
	for i := 0; i < 50; i++ {
		c1, c2 := got[1+2*i], got[2+2*i]
		if string(c1.Key) != "k2" || string(c1.Value) != fmt.Sprint("again-", i) || c1.Delete {
			t.Fatalf("change %d: %+v", 1+2*i, c1)
		}
		if string(c2.Key) != fmt.Sprint("z", i) || !bytes.Equal(c2.Value, bytes.Repeat([]byte{'q'}, i)) || c2.Value == nil || c2.Delete {
			t.Fatalf("change %d: %+v", 2+2*i, c2)
		}
	}
}

// s36Snap is a snapshot view's layers and the model at the time.
type s36Snap struct {
	layers []*Layer
	model  map[string]map[string]string
	seqs   map[string]uint64
	step   int
}

func s36Clone(m map[string]map[string]string) map[string]map[string]string {
	c := make(map[string]map[string]string, len(m))
	for b, kv := range m {
		c[b] = make(map[string]string, len(kv))
		for k, v := range kv {
			c[b][k] = v
		}
	}
	return c
}

func s36CloneSeqs(m map[string]uint64) map[string]uint64 {
	c := make(map[string]uint64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// s36CheckView compares v with the model: each bucket's walk and Gets
// (also of absent keys), sequences, and that bucket "d" is absent.
func s36CheckView(t *testing.T, what string, v *View, m map[string]map[string]string, seqs map[string]uint64, keys []string) {
	t.Helper()
	for _, name := range []string{"a", "b", "c"} {
		b := v.Bucket([]byte(name))
		if b == nil {
			t.Fatalf("%s: bucket %s missing", what, name)
		}
		s36Equal(t, what+" bucket "+name, s36Walk(t, b), s36ModelDump(m[name]))
		for _, k := range keys {
			got := b.Get([]byte(k))
			want, has := m[name][k]
			if (got != nil) != has || string(got) != want {
				t.Fatalf("%s: %s Get(%q) = %q (nil %v), want %q (present %v)", what, name, k, got, got == nil, want, has)
			}
		}
		if s := b.Sequence(); s != seqs[name] {
			t.Fatalf("%s: %s sequence %d, want %d", what, name, s, seqs[name])
		}
	}
	if v.Bucket([]byte("d")) != nil {
		t.Fatalf("%s: bucket d exists", what)
	}
}

// Randomized: writes (from caller buffers scribbled right after), Gets
// whose results are kept and checked for good, marks and rollbacks,
// Resets, snapshots checked at the end, new top layers, and a long-lived
// cursor stepped between everything, against a map.
func TestReviewS36RandomAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { s36Random(t, seed) })
	}
}

func s36Random(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x536))
	keys := []string{"a", "aa", "ab", "b", "k\x00", "k", "k1", "k2", "k3", "m", "z", "\xff", "\xff\xff", "\x00"}
	content := map[string]map[string]string{"a": {"a": "base-a", "k1": "base-k1", "z": "base-z"}, "b": {}}
	db, base := s34Base(t, content, map[string]uint64{"a": 3})
	// Bucket c is only in a layer (its base is another file's).
	_, baseC := s34Base(t, map[string]map[string]string{"c": {}}, nil)
	older0 := NewLayer()
	cw := NewWriter(baseC, older0)
	s34Must(t, cw.Bucket([]byte("c")).Put([]byte("k"), []byte("layer-c")))
	s34Must(t, cw.Bucket([]byte("c")).Put([]byte("m"), []byte("")))
	model := s36Clone(content)
	model["c"] = map[string]string{"k": "layer-c", "m": ""}
	seqs := map[string]uint64{"a": 3}

	older := []*Layer{older0}
	top := NewLayer()
	w := NewWriter(base, top, older...)
	type markAt struct {
		m     Mark
		model map[string]map[string]string
		seqs  map[string]uint64
		nch   int
	}
	var marks []markAt
	resetModel, resetSeqs := s36Clone(model), s36CloneSeqs(seqs)
	var stale *Mark // a mark from before the last Reset
	var changes []string
	var kept []s36Kept
	var snaps []s36Snap
	scratch := make([]byte, 64)
	scribble := func() {
		for i := range scratch {
			scratch[i] = byte(r.IntN(256))
		}
	}
	chDump := func(c Change) string {
		switch {
		case c.IsSeq:
			return fmt.Sprintf("%s seq %d", c.Bucket, c.Seq)
		case c.Delete:
			return fmt.Sprintf("%s del %q %v", c.Bucket, c.Key, c.Value == nil)
		}
		return fmt.Sprintf("%s put %q=%q %v", c.Bucket, c.Key, c.Value, c.Value == nil)
	}
	// The long-lived cursor and where it is ("" with curOff: off the keys).
	curB := "a"
	cur := w.Bucket([]byte(curB)).Cursor()
	ck, _ := cur.First()
	curAt, curOff := string(ck), ck == nil
	nextKey := func(from string, fwd bool) (string, bool) {
		best, ok := "", false
		for k := range model[curB] {
			if fwd && k > from && (!ok || k < best) || !fwd && k < from && (!ok || k > best) {
				best, ok = k, true
			}
		}
		return best, ok
	}
	buckets := []string{"a", "b", "c"}
	for step := 0; step < 1500; step++ {
		name := buckets[r.IntN(len(buckets))]
		b := w.Bucket([]byte(name))
		key := keys[r.IntN(len(keys))]
		switch op := r.IntN(100); {
		case op < 30: // put from the scratch buffer, scribbled after
			n := r.IntN(24)
			kb := append(scratch[:0], key...)
			vb := scratch[len(key) : len(key)+n]
			for i := range vb {
				vb[i] = byte('a' + r.IntN(26))
			}
			val := string(vb)
			if n == 0 && r.IntN(2) == 0 {
				vb = nil
			}
			s34Must(t, b.Put(kb, vb))
			scribble()
			model[name][key] = val
			changes = append(changes, fmt.Sprintf("%s put %q=%q false", name, key, val))
		case op < 42:
			s34Must(t, b.Delete([]byte(key)))
			delete(model[name], key)
			changes = append(changes, fmt.Sprintf("%s del %q true", name, key))
		case op < 55: // Get, kept
			got := b.Get([]byte(key))
			want, has := model[name][key]
			if (got != nil) != has || string(got) != want {
				t.Fatalf("step %d: %s Get(%q) = %q (nil %v), want %q (present %v)", step, name, key, got, got == nil, want, has)
			}
			if got != nil {
				kept = append(kept, s36Kept{fmt.Sprintf("step %d Get %s/%q", step, name, key), got, want})
			}
		case op < 62:
			marks = append(marks, markAt{w.Mark(), s36Clone(model), s36CloneSeqs(seqs), len(changes)})
		case op < 68 && len(marks) > 0:
			i := r.IntN(len(marks))
			w.Rollback(marks[i].m)
			model, seqs, changes = s36Clone(marks[i].model), s36CloneSeqs(marks[i].seqs), changes[:marks[i].nch]
			marks = marks[:i+1]
		case op < 70 && stale != nil:
			w.Rollback(*stale)
			model, seqs, changes = s36Clone(resetModel), s36CloneSeqs(resetSeqs), nil
			marks = nil
		case op < 72:
			m := w.Mark()
			w.Reset()
			stale = &m
			resetModel, resetSeqs, changes, marks = s36Clone(model), s36CloneSeqs(seqs), nil, nil
		case op < 78: // snapshot
			snaps = append(snaps, s36Snap{append([]*Layer{w.Snapshot()}, older...), s36Clone(model), s36CloneSeqs(seqs), step})
		case op < 80 && len(older) < 4: // a new top layer; the old one is frozen
			older = append([]*Layer{top}, older...)
			top = NewLayer()
			w = NewWriter(base, top, older...)
			marks, changes, stale = nil, nil, nil
			resetModel, resetSeqs = s36Clone(model), s36CloneSeqs(seqs)
			cur = w.Bucket([]byte(curB)).Cursor()
			ck, _ := cur.Seek([]byte(curAt))
			curAt, curOff = string(ck), ck == nil
		case op < 83:
			s, err := b.NextSequence()
			s34Must(t, err)
			if s != seqs[name]+1 {
				t.Fatalf("step %d: NextSequence %d, want %d", step, s, seqs[name]+1)
			}
			seqs[name] = s
			changes = append(changes, fmt.Sprintf("%s seq %d", name, s))
		case op < 86: // re-seek the long-lived cursor, maybe in another bucket
			curB = buckets[r.IntN(len(buckets))]
			cur = w.Bucket([]byte(curB)).Cursor()
			sk := append(scratch[:0], key...)
			k, v := cur.Seek(sk)
			scribble()
			exp, ok := "", false
			if _, has := model[curB][key]; has {
				exp, ok = key, true
			} else {
				exp, ok = nextKey(key, true)
			}
			if string(k) != exp || (k != nil) != ok || ok && string(v) != model[curB][exp] {
				t.Fatalf("step %d: %s Seek(%q) = %q=%q, want %q (found %v)", step, curB, key, k, v, exp, ok)
			}
			curAt, curOff = exp, !ok
		case op < 96: // step the long-lived cursor
			fwd := r.IntN(2) == 0
			var k, v []byte
			if fwd {
				k, v = cur.Next()
			} else {
				k, v = cur.Prev()
			}
			if curOff {
				if k != nil {
					t.Fatalf("step %d: a cursor off the keys stepped to %q", step, k)
				}
				break
			}
			exp, ok := nextKey(curAt, fwd)
			if string(k) != exp || (k != nil) != ok || ok && string(v) != model[curB][exp] {
				t.Fatalf("step %d: %s cursor from %q (fwd %v) = %q=%q, want %q=%q (found %v)", step, curB, curAt, fwd, k, v, exp, model[curB][exp], ok)
			}
			curAt, curOff = exp, !ok
			if ok && r.IntN(4) == 0 {
				kept = append(kept, s36Kept{fmt.Sprintf("step %d cursor value %s/%q", step, curB, k), v, string(v)})
				kept = append(kept, s36Kept{fmt.Sprintf("step %d cursor key %s", step, curB), k, string(k)})
			}
			if curOff {
				ck, _ := cur.First()
				curAt, curOff = string(ck), ck == nil
			}
		default:
			var got []string
			for _, c := range w.Changes() {
				got = append(got, chDump(c))
			}
			s36Equal(t, fmt.Sprint("step ", step, " Changes"), got, changes)
		}
		if step%250 == 0 {
			s36CheckView(t, fmt.Sprint("step ", step), w, model, seqs, keys)
			s36CheckKept(t, fmt.Sprint("step ", step), kept)
		}
	}
	s36CheckView(t, "end", w, model, seqs, keys)
	s36CheckKept(t, "end", kept)
	for i, s := range snaps {
		s36CheckView(t, fmt.Sprintf("snapshot %d (step %d)", i, s.step), NewView(base, s.layers...), s.model, s.seqs, keys)
	}
	// The layers applied to the file, oldest first, give the model.
	s34Must(t, db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("c")); err != nil {
			return err
		}
		all := append([]*Layer{top}, older...)
		for i := len(all) - 1; i >= 0; i-- {
			if err := all[i].Apply(
				func(bk string, k, v []byte) error { return tx.Bucket([]byte(bk)).Put(k, v) },
				func(bk string, k []byte) error { return tx.Bucket([]byte(bk)).Delete(k) },
				func(bk string, s uint64) error { return tx.Bucket([]byte(bk)).SetSequence(s) }); err != nil {
				return err
			}
		}
		return nil
	}))
	tx, err := db.Begin(false)
	s34Must(t, err)
	defer tx.Rollback()
	s36CheckView(t, "applied", NewView(boltBase{tx}), model, seqs, keys)
	s36CheckKept(t, "after apply", kept)
}

// Readers of snapshots (each its own view) walk and Get while the writer
// overwrites, deletes and rolls back the same keys (items the snapshots
// share): each reader sees exactly its snapshot's state. Run with -race.
func TestReviewS36SnapshotReadersWhileRollingBack(t *testing.T) {
	content := map[string]map[string]string{"b": {}}
	for i := 0; i < 30; i++ {
		content["b"][fmt.Sprintf("k%02d", i)] = "base"
	}
	_, base := s34Base(t, content, nil)
	top := NewLayer()
	w := NewWriter(base, top)
	b := w.Bucket([]byte("b"))
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for round := 0; round < 60; round++ {
		m := w.Mark()
		for i := 0; i < 10; i++ {
			k := []byte(fmt.Sprintf("k%02d", (round*7+i*3)%34))
			if i%4 == 0 {
				s34Must(t, b.Delete(k))
			} else {
				s34Must(t, b.Put(k, []byte(fmt.Sprintf("r%d-%d", round, i))))
			}
		}
		if round%3 == 0 {
			w.Rollback(m)
		}
		snap := w.Snapshot()
		want := s36Dump(t, NewView(base, snap), "b")
		wg.Add(1)
		go func(round int, snap *Layer, want []string) {
			defer wg.Done()
			v := NewView(base, snap)
			for rep := 0; rep < 5; rep++ {
				bk := v.Bucket([]byte("b"))
				var got []string
				c := bk.Cursor()
				for k, val := c.First(); k != nil; k, val = c.Next() {
					got = append(got, fmt.Sprintf("%q=%q", k, val))
					if g := bk.Get(k); !bytes.Equal(g, val) {
						errs <- fmt.Sprintf("round %d: Get(%q) = %q, cursor %q", round, k, g, val)
						return
					}
				}
				if !slices.Equal(got, want) {
					errs <- fmt.Sprintf("round %d rep %d: reader saw\n%q\nwant\n%q", round, rep, got, want)
					return
				}
			}
		}(round, snap, want)
		// More writes and a rollback while the readers run.
		m2 := w.Mark()
		for i := 0; i < 5; i++ {
			s34Must(t, b.Put([]byte(fmt.Sprintf("k%02d", (round+i)%30)), []byte("transient")))
		}
		w.Rollback(m2)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
