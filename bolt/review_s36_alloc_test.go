package bolt

// Review s36 (commit "fewer allocations on the committer's path"): the
// pre-sized redo record must be byte for byte the record it always was,
// and an empty value must go through the log as a put, not a delete.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
)

// s36RefEncode is the record format written out independently of
// engine.encode (see its comment).
func s36RefEncode(id []byte, ch []layered.Change) []byte {
	var out []byte
	out = append(out, id...)
	put := func(b []byte) {
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	for _, c := range ch {
		switch {
		case c.IsSeq:
			out = append(out, 's')
			put([]byte(c.Bucket))
			out = binary.BigEndian.AppendUint64(out, c.Seq)
		case c.Delete:
			out = append(out, 'd')
			put([]byte(c.Bucket))
			put(c.Key)
		default:
			out = append(out, 'p')
			put([]byte(c.Bucket))
			put(c.Key)
			put(c.Value)
		}
	}
	return out
}

// s36DumpTx is every key of the buckets of tx, "bucket/key=value", and
// each bucket's sequence.
func s36DumpTx(tx *bbolt.Tx, buckets ...string) []string {
	var out []string
	for _, name := range buckets {
		b := tx.Bucket([]byte(name))
		if b == nil {
			out = append(out, name+" missing")
			continue
		}
		_ = b.ForEach(func(k, v []byte) error {
			out = append(out, fmt.Sprintf("%s/%q=%q nil=%v", name, k, v, v == nil))
			return nil
		})
		out = append(out, fmt.Sprintf("%s seq %d", name, b.Sequence()))
	}
	return out
}

// The changes of a writer (puts of empty, nil, large and binary values,
// deletes, sequences, overwrites, a rolled back part) encode to the
// reference record, and applying it to a copy of the base gives what
// applying the layer gives.
func TestReviewS36EncodeMatchesReferenceAndRedoes(t *testing.T) {
	id := bytes.Repeat([]byte{0xA5}, 16)
	e := &engine{id: id}
	open := func(name string) *bbolt.DB {
		db, err := bbolt.Open(filepath.Join(t.TempDir(), name), 0o600, &bbolt.Options{InitialMmapSize: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.Update(func(tx *bbolt.Tx) error {
			for _, b := range []string{"a", "bb"} {
				bk, err := tx.CreateBucket([]byte(b))
				if err != nil {
					return err
				}
				for i := 0; i < 5; i++ {
					if err := bk.Put([]byte(fmt.Sprint("k", i)), []byte(fmt.Sprint("base", i))); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return db
	}
	viaLayer, viaRecord := open("layer.db"), open("record.db")
	tx, err := viaLayer.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() }) // before the file closes, also on a failure
	top := layered.NewLayer()
	w := layered.NewWriter(baseOf{tx}, top)
	a, bb := w.Bucket([]byte("a")), w.Bucket([]byte("bb"))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.Put([]byte("k0"), nil))
	must(a.Put([]byte("k1"), []byte{}))
	must(a.Delete([]byte("k2")))
	must(a.Put([]byte("big"), bytes.Repeat([]byte{0xff}, 70000)))
	must(a.Put([]byte("bin\x00\xff"), []byte{0, 1, 2, 0x80, 0xff}))
	m := w.Mark()
	must(a.Put([]byte("k3"), []byte("rolled back")))
	must(bb.Delete([]byte("k0")))
	_, err = bb.NextSequence()
	must(err)
	w.Rollback(m)
	must(bb.Put([]byte("k0"), []byte("")))
	must(bb.Put(bytes.Repeat([]byte{'K'}, 300), bytes.Repeat([]byte{'v'}, 200)))
	_, err = bb.NextSequence()
	must(err)
	must(bb.SetSequence(1 << 40))
	must(a.Put([]byte("k4"), []byte("x")))
	must(a.Put([]byte("k4"), []byte("")))
	must(a.Delete([]byte("k1")))
	must(a.Put([]byte("k1"), nil))
	changes := w.Changes()
	rec := e.encode(changes)
	if ref := s36RefEncode(id, changes); !bytes.Equal(rec, ref) {
		t.Fatalf("encode differs from the record format:\n got %x\nwant %x", rec, ref)
	}
	_ = tx.Rollback()
	must(viaLayer.Update(func(tx *bbolt.Tx) error { return applyLayer(tx, top) }))
	must(viaRecord.Update(func(tx *bbolt.Tx) error { return e.applyRecord(tx, slices.Clone(rec)) }))
	var got, want []string
	must(viaLayer.View(func(tx *bbolt.Tx) error { want = s36DumpTx(tx, "a", "bb"); return nil }))
	must(viaRecord.View(func(tx *bbolt.Tx) error { got = s36DumpTx(tx, "a", "bb"); return nil }))
	if !slices.Equal(got, want) {
		t.Fatalf("redone record gives\n%q\napplied layer\n%q", got, want)
	}
	for _, k := range []string{`a/"k0"=""`, `a/"k1"=""`, `a/"k4"=""`, `bb/"k0"=""`} {
		if !slices.ContainsFunc(got, func(s string) bool { return len(s) > len(k) && s[:len(k)] == k }) {
			t.Fatalf("empty value %s missing after redo: %q", k, got)
		}
	}
	for _, s := range got {
		if len(s) > 6 && s[:6] == `a/"k2"` {
			t.Fatalf("deleted key present after redo: %s", s)
		}
	}
	if !slices.Contains(got, `a/"k3"="base3" nil=false`) {
		t.Fatalf("rolled back put of k3 reached the record: %q", got)
	}
	if !slices.Contains(got, fmt.Sprintf("bb seq %d", uint64(1)<<40)) {
		t.Fatalf("sequence after redo: %q", got)
	}
	// An empty batch encodes to the id alone; a record of only a
	// sequence, too, matches the reference.
	if r := e.encode(nil); !bytes.Equal(r, id) {
		t.Fatalf("empty record %x", r)
	}
	seqOnly := []layered.Change{{Bucket: "a", IsSeq: true, Seq: 7}}
	if r := e.encode(seqOnly); !bytes.Equal(r, s36RefEncode(id, seqOnly)) {
		t.Fatalf("sequence record %x", r)
	}
}

// Through the store: concurrent mutations (some failing after their
// writes, rolled back alone) put empty values, overwrite and delete; a
// crash before any flush, then the redo at Open, gives exactly the
// acknowledged state, empty values present and non-nil.
func TestReviewS36EmptyValuesSurviveRedo(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "starlease.db")
	o := Options{ReapInterval: -1, FlushInterval: time.Hour}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	// Each goroutine writes its own keys (their order is its own).
	key := func(n int) []byte {
		return []byte(fmt.Sprintf("review-s36/%02d/%03d", n/30, n%30))
	}
	var mu sync.Mutex
	model := map[string]string{}
	var wg sync.WaitGroup
	errFail := errors.New("review s36: this function fails")
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				n := g*30 + i
				prev1, prev3 := max(n-1, g*30), max(n-3, g*30)
				fail := n%5 == 4
				err := s.mutate(ctx, func(tx *layered.View) error {
					b := tx.Bucket(bucketMeta)
					switch n % 4 {
					case 0:
						if err := b.Put(key(n), nil); err != nil {
							return err
						}
					case 1:
						if err := b.Put(key(n), []byte{}); err != nil {
							return err
						}
						if err := b.Put(key(prev1), []byte("overwritten")); err != nil {
							return err
						}
					case 2:
						if err := b.Put(key(n), []byte(fmt.Sprint("v", n))); err != nil {
							return err
						}
						if err := b.Put(key(n), []byte("")); err != nil {
							return err
						}
					case 3:
						if err := b.Put(key(n), []byte("gone")); err != nil {
							return err
						}
						if err := b.Delete(key(n)); err != nil {
							return err
						}
						if err := b.Put(key(prev3), []byte{}); err != nil {
							return err
						}
					}
					if fail {
						return errFail
					}
					return nil
				})
				if fail {
					// mutate answers any error that is not a lease
					// error as outcome_unknown; what matters is that
					// the function failed and its writes are gone.
					if err == nil {
						t.Errorf("failing function %d succeeded", n)
					}
					continue
				}
				if err != nil {
					t.Errorf("mutation %d: %v", n, err)
					continue
				}
				mu.Lock()
				switch n % 4 {
				case 0:
					model[string(key(n))] = ""
				case 1:
					model[string(key(n))] = ""
					model[string(key(prev1))] = "overwritten"
				case 2:
					model[string(key(n))] = ""
				case 3:
					model[string(key(prev3))] = ""
				}
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	check := func(what string, s *Store) {
		t.Helper()
		err := s.view(ctx, func(tx *layered.View) error {
			b := tx.Bucket(bucketMeta)
			c := b.Cursor()
			got := map[string]string{}
			prefix := []byte("review-s36/")
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if v == nil {
					return fmt.Errorf("%s: %q has a nil value", what, k)
				}
				if g := b.Get(k); g == nil || !bytes.Equal(g, v) {
					return fmt.Errorf("%s: Get(%q) = %q (nil %v), cursor %q", what, k, g, g == nil, v)
				}
				got[string(k)] = string(v)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != len(model) {
				return fmt.Errorf("%s: %d keys, want %d:\n got %q\nwant %q", what, len(got), len(model), got, model)
			}
			for k, v := range model {
				if g, ok := got[k]; !ok || g != v {
					return fmt.Errorf("%s: %q = %q (present %v), want %q", what, k, g, ok, v)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check("before the crash", s)
	crash(t, s)
	s, err = Open(path, o)
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	check("after the redo", s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// And in the tree itself after a clean close.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		n := 0
		mu.Lock()
		defer mu.Unlock()
		for k, want := range model {
			v := b.Get([]byte(k))
			if v == nil || string(v) != want {
				return fmt.Errorf("tree: %q = %q (nil %v), want %q", k, v, v == nil, want)
			}
			n++
		}
		c := b.Cursor()
		prefix := []byte("review-s36/")
		m := 0
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			m++
		}
		if m != n {
			return fmt.Errorf("tree holds %d review keys, want %d", m, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
