package layered

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// boltBase adapts a bbolt read transaction.
type boltBase struct{ tx *bbolt.Tx }

func (b boltBase) Bucket(name []byte) BaseBucket {
	if bk := b.tx.Bucket(name); bk != nil {
		return boltBucket{bk}
	}
	return nil
}

type boltBucket struct{ b *bbolt.Bucket }

func (b boltBucket) Get(k []byte) []byte { return b.b.Get(k) }
func (b boltBucket) Cursor() BaseCursor  { return b.b.Cursor() }
func (b boltBucket) Sequence() uint64    { return b.b.Sequence() }

// model is the expected state: bucket → key → value, and sequences.
type model struct {
	kv   map[string]map[string]string
	seqs map[string]uint64
}

func newModel(buckets []string) *model {
	m := &model{kv: map[string]map[string]string{}, seqs: map[string]uint64{}}
	for _, b := range buckets {
		m.kv[b] = map[string]string{}
	}
	return m
}

func (m *model) clone() *model {
	c := &model{kv: map[string]map[string]string{}, seqs: map[string]uint64{}}
	for b, kv := range m.kv {
		c.kv[b] = map[string]string{}
		for k, v := range kv {
			c.kv[b][k] = v
		}
	}
	for b, s := range m.seqs {
		c.seqs[b] = s
	}
	return c
}

func (m *model) sorted(b string) []string {
	var ks []string
	for k := range m.kv[b] {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// check compares every observable of v with m: each key's Get (and some
// absent ones), sequences, and cursor walks in both directions, from
// seeks, and mixed steps.
func check(t *testing.T, r *rand.Rand, what string, v *View, m *model, keys []string) {
	t.Helper()
	for b := range m.kv {
		bk := v.Bucket([]byte(b))
		if bk == nil {
			t.Fatalf("%s: bucket %s missing", what, b)
		}
		for _, k := range keys {
			got, want := bk.Get([]byte(k)), m.kv[b][k]
			_, has := m.kv[b][k]
			if (got != nil) != has || string(got) != want {
				t.Fatalf("%s: %s Get(%q) = %q (nil %v), want %q (present %v)", what, b, k, got, got == nil, want, has)
			}
		}
		if got := bk.Sequence(); got != m.seqs[b] {
			t.Fatalf("%s: %s Sequence = %d, want %d", what, b, got, m.seqs[b])
		}
		want := m.sorted(b)
		var fwd, back []string
		c := bk.Cursor()
		for k, val := c.First(); k != nil && len(fwd) <= len(want); k, val = c.Next() {
			if string(val) != m.kv[b][string(k)] {
				t.Fatalf("%s: %s cursor value of %q = %q", what, b, k, val)
			}
			fwd = append(fwd, string(k))
		}
		offEnd(t, what+" after the last key", c)
		for k, _ := c.Last(); k != nil && len(back) <= len(want); k, _ = c.Prev() {
			back = append(back, string(k))
		}
		offEnd(t, what+" before the first key", c)
		slices.Reverse(back)
		if !slices.Equal(fwd, want) || !slices.Equal(back, want) {
			t.Fatalf("%s: %s walks\n fwd %q\nback %q\nwant %q", what, b, fwd, back, want)
		}
		// Seeks, then a few mixed steps, against positions in want.
		for i := 0; i < 6; i++ {
			seek := keys[r.IntN(len(keys))]
			if r.IntN(3) == 0 {
				seek += "\x00"
			}
			pos, _ := slices.BinarySearch(want, seek)
			k, _ := c.Seek([]byte(seek))
			for step := 0; ; step++ {
				var exp []byte
				if pos >= 0 && pos < len(want) {
					exp = []byte(want[pos])
				}
				if !bytes.Equal(k, exp) {
					t.Fatalf("%s: %s seek %q step %d: got %q, want %q (want %q)", what, b, seek, step, k, exp, want)
				}
				if exp == nil {
					offEnd(t, what+" after a seek", c)
					break
				}
				if step == 5 {
					break
				}
				if r.IntN(2) == 0 {
					k, _ = c.Next()
					pos++
				} else {
					k, _ = c.Prev()
					pos--
				}
			}
		}
	}
}

// offEnd checks a cursor that found no key stays off the keys.
func offEnd(t *testing.T, what string, c *Cursor) {
	t.Helper()
	for i := 0; i < 2; i++ {
		if k, _ := c.Next(); k != nil {
			t.Fatalf("%s: Next = %q, want nil", what, k)
		}
		if k, _ := c.Prev(); k != nil {
			t.Fatalf("%s: Prev = %q, want nil", what, k)
		}
	}
}

// The layered view answers as one map would, through writes, rollbacks,
// snapshots, new layers and flushes of the oldest layer to a real bbolt
// base, with snapshot readers that keep seeing the state they were taken
// at.
func TestLayersBehaveAsOneMap(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { layeredRun(t, seed) })
	}
}

func layeredRun(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed*7919))
	buckets := []string{"a", "b"}
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "base.db"), 0o600, &bbolt.Options{InitialMmapSize: 64 << 20}) // no remap: it waits for open read transactions
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Close waits for open read transactions: a failing check must not
	// leave any, or the test hangs instead of failing.
	var open []*bbolt.Tx
	defer func() {
		for _, tx := range open {
			_ = tx.Rollback()
		}
	}()
	begin := func() *bbolt.Tx {
		tx, err := db.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, tx)
		return tx
	}
	m := newModel(buckets)
	var keys []string
	for i := 0; i < 40; i++ {
		keys = append(keys, fmt.Sprintf("k%02d", r.IntN(60)))
	}
	keys = append(keys, "", "\xff")
	keys = slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(keys))), func(k string) bool { return k == "" })
	// A base with some keys.
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, b := range buckets {
			bk, err := tx.CreateBucket([]byte(b))
			if err != nil {
				return err
			}
			for _, k := range keys {
				if r.IntN(2) == 0 {
					v := fmt.Sprintf("base-%s-%d", k, r.IntN(100))
					if err := bk.Put([]byte(k), []byte(v)); err != nil {
						return err
					}
					m.kv[b][k] = v
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rtx := begin()
	base := boltBase{rtx}
	var older []*Layer // frozen layers, newest first
	top := NewLayer()
	w := NewWriter(base, top, older...)
	type reader struct {
		v *View
		m *model
	}
	var readers []reader
	for step := 0; step < 400; step++ {
		switch op := r.IntN(100); {
		case op < 45:
			b, k := buckets[r.IntN(2)], keys[r.IntN(len(keys))]
			if r.IntN(3) == 0 {
				if err := w.Bucket([]byte(b)).Delete([]byte(k)); err != nil {
					t.Fatal(err)
				}
				delete(m.kv[b], k)
			} else {
				v := fmt.Sprintf("%s-%d", k, step)
				buf := []byte(v)
				if err := w.Bucket([]byte(b)).Put([]byte(k), buf); err != nil {
					t.Fatal(err)
				}
				buf[0] = '!' // the layer copied it
				m.kv[b][k] = v
			}
		case op < 50:
			b := buckets[r.IntN(2)]
			n, err := w.Bucket([]byte(b)).NextSequence()
			if err != nil {
				t.Fatal(err)
			}
			m.seqs[b]++
			if n != m.seqs[b] {
				t.Fatalf("NextSequence = %d, want %d", n, m.seqs[b])
			}
		case op < 60:
			// A function that fails: its writes are rolled back.
			mark, before := w.Mark(), len(w.Changes())
			for i := 0; i < 1+r.IntN(5); i++ {
				b, k := buckets[r.IntN(2)], keys[r.IntN(len(keys))]
				switch r.IntN(3) {
				case 0:
					_ = w.Bucket([]byte(b)).Delete([]byte(k))
				case 1:
					_, _ = w.Bucket([]byte(b)).NextSequence()
				default:
					_ = w.Bucket([]byte(b)).Put([]byte(k), []byte("doomed"))
				}
			}
			w.Rollback(mark)
			if len(w.Changes()) != before {
				t.Fatalf("changes after rollback: %d, want %d", len(w.Changes()), before)
			}
		case op < 70:
			check(t, r, fmt.Sprintf("writer step %d", step), w, m, keys)
		case op < 78:
			// A reader's snapshot of everything written so far.
			rt := begin()
			// The reader's base must be the same committed state: readers
			// pair a base transaction with the layers above it.
			layers := append([]*Layer{w.Snapshot()}, older...)
			readers = append(readers, reader{v: NewView(boltBase{rt}, layers...), m: m.clone()})
		case op < 86:
			// Freeze the top layer; a new one takes writes.
			older = append([]*Layer{top}, older...)
			top = NewLayer()
			w = NewWriter(base, top, older...)
		case op < 92 && len(older) > 0:
			// Flush the oldest frozen layer to the base.
			oldest := older[len(older)-1]
			if err := db.Update(func(tx *bbolt.Tx) error {
				return oldest.Apply(
					func(b string, k, v []byte) error { return tx.Bucket([]byte(b)).Put(k, v) },
					func(b string, k []byte) error { return tx.Bucket([]byte(b)).Delete(k) },
					func(b string, s uint64) error { return tx.Bucket([]byte(b)).SetSequence(s) })
			}); err != nil {
				t.Fatal(err)
			}
			older = older[:len(older)-1]
			if err := rtx.Rollback(); err != nil {
				t.Fatal(err)
			}
			rtx = begin()
			base = boltBase{rtx}
			w = NewWriter(base, top, older...)
		default:
			for i := range readers {
				check(t, r, fmt.Sprintf("reader %d at step %d", i, step), readers[i].v, readers[i].m, keys)
			}
		}
	}
	check(t, r, "end", w, m, keys)
	for i := range readers {
		check(t, r, fmt.Sprintf("reader %d at the end", i), readers[i].v, readers[i].m, keys)
	}
}
