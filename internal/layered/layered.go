// Package layered is an ordered key-value view of bbolt-style buckets made
// of in-memory layers over a committed base: the shape that lets a store
// acknowledge a write once its log record is durable and commit its tree
// later, for many writes at once (etcd's backend shape), while every
// reader still sees every acknowledged write.
//
// A View reads through its layers, newest first, then the base; a key a
// layer deletes stays hidden below it. The top layer of a writable View
// takes writes, remembers each one (Changes: what the log record of a
// batch holds) and can roll back to a Mark, so one failing function of a
// batch leaves no trace while the others keep theirs. Snapshot freezes the
// top layer in O(buckets) (copy on write), for readers that must not see
// later writes.
//
// Semantics follow bbolt's where the store relies on them: Get of an
// absent key is nil; a Cursor's First, Last, Next, Prev and Seek return
// nil keys at the ends; keys must be non-empty and at most MaxKeySize
// bytes; values at most MaxValueSize. Unlike bbolt's, a cursor that
// returned nil stays off the keys (Next and Prev return nil) until First,
// Last or Seek: bbolt's steps from there depend on which end and move
// was hit, and no caller should depend on them. Keys and values are copied on Put:
// layers outlive the transactions whose buffers they came from.
package layered

import (
	"bytes"
	"errors"

	"github.com/tidwall/btree"
)

// Limits of bbolt's, checked when a write is made so that applying a
// layer to the base later never fails for a reason the writer could have
// been told.
const (
	MaxKeySize   = 32768
	MaxValueSize = (1 << 31) - 2
)

var (
	ErrKeyRequired   = errors.New("layered: key required")
	ErrKeyTooLarge   = errors.New("layered: key too large")
	ErrValueTooLarge = errors.New("layered: value too large")
	ErrReadOnly      = errors.New("layered: write to a read-only view")
)

// Base is the committed state under the layers (a bbolt read transaction).
type Base interface {
	// Bucket returns the named bucket, or nil if the base has none.
	Bucket(name []byte) BaseBucket
}

// BaseBucket is a bucket of the base.
type BaseBucket interface {
	Get(key []byte) []byte
	Cursor() BaseCursor
	Sequence() uint64
}

// BaseCursor walks a base bucket (bbolt's Cursor).
type BaseCursor interface {
	First() (key, value []byte)
	Last() (key, value []byte)
	Next() (key, value []byte)
	Prev() (key, value []byte)
	Seek(seek []byte) (key, value []byte)
}

// item is one key's latest state in a layer: a value, or deleted. Trees
// hold pointers: a write after a Snapshot copies the nodes on its path,
// and a node of pointers is a seventh of a node of items.
type item struct {
	key, value []byte
	deleted    bool
}

func less(a, b *item) bool { return bytes.Compare(a.key, b.key) < 0 }

// Layer holds the writes of a span of batches.
type Layer struct {
	buckets map[string]*btree.BTreeG[*item]
	seqs    map[string]uint64
}

// NewLayer returns an empty layer.
func NewLayer() *Layer {
	return &Layer{buckets: map[string]*btree.BTreeG[*item]{}, seqs: map[string]uint64{}}
}

// Empty reports whether the layer holds no write.
func (l *Layer) Empty() bool {
	for _, t := range l.buckets {
		if t.Len() > 0 {
			return false
		}
	}
	return len(l.seqs) == 0
}

func (l *Layer) tree(bucket string, create bool) *btree.BTreeG[*item] {
	t := l.buckets[bucket]
	if t == nil && create {
		t = btree.NewBTreeGOptions(less, btree.Options{NoLocks: true})
		l.buckets[bucket] = t
	}
	return t
}

// Snapshot is an immutable copy of l (its trees copied on write): what
// readers take while the writer goes on writing to l.
func (l *Layer) Snapshot() *Layer { return l.snapshot() }

// snapshot is an immutable copy of l (its trees copied on write).
func (l *Layer) snapshot() *Layer {
	s := &Layer{buckets: make(map[string]*btree.BTreeG[*item], len(l.buckets)), seqs: make(map[string]uint64, len(l.seqs))}
	for name, t := range l.buckets {
		s.buckets[name] = t.Copy()
	}
	for name, v := range l.seqs {
		s.seqs[name] = v
	}
	return s
}

// Apply writes every key and sequence the layer holds to put, del and
// setSeq, bucket by bucket in key order (what committing it to the base
// does). It stops at the first error.
func (l *Layer) Apply(put func(bucket string, key, value []byte) error, del func(bucket string, key []byte) error,
	setSeq func(bucket string, seq uint64) error) error {
	for name, t := range l.buckets {
		var err error
		t.Scan(func(it *item) bool {
			if it.deleted {
				err = del(name, it.key)
			} else {
				err = put(name, it.key, it.value)
			}
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	for name, v := range l.seqs {
		if err := setSeq(name, v); err != nil {
			return err
		}
	}
	return nil
}

// Change is one write, as a log record holds it: Put (Value non-nil),
// Delete (Delete set) or SetSequence (IsSeq set, Seq).
type Change struct {
	Bucket string
	Key    []byte
	Value  []byte
	Delete bool
	IsSeq  bool
	Seq    uint64
}

// undo restores one key's (or sequence's) previous state in the top
// layer.
type undo struct {
	bucket string
	prev   *item
	had    bool // the layer held prev (else the key was absent from it)
	isSeq  bool
	seq    uint64
}

// View is a consistent view: layers (newest first) over a base. Only a
// view made by NewWriter takes writes, into its first layer. A View is
// used by one goroutine at a time (its lookups share a probe and a bucket
// cache); layers and snapshots may be shared.
type View struct {
	layers []*Layer
	base   Base

	writable bool
	id       int
	changes  []Change
	undos    []undo
	// gen counts Resets: a Mark from before one rolls back to it.
	gen int
	// writes counts changes to the top layer (writes and rollbacks): a
	// cursor positioned before one positions itself again.
	writes uint64
	// probe is the key a lookup searches the trees for (a View is used by
	// one goroutine; a new one per lookup would be an allocation each).
	probe item
	// buckets are the buckets Bucket found: a read transaction of
	// bbolt's finds a bucket again (a seek and a copy) at every call.
	buckets []*Bucket
}

// probeFor is v's probe set to key.
func (v *View) probeFor(key []byte) *item {
	v.probe.key = key
	return &v.probe
}

// NewView is a read-only view of layers (newest first) over base. The
// layers must not change while it is used: pass snapshots.
func NewView(base Base, layers ...*Layer) *View {
	return &View{layers: layers, base: base}
}

// NewWriter is a view whose writes go to top, over older (newest first)
// and base.
func NewWriter(base Base, top *Layer, older ...*Layer) *View {
	return &View{layers: append([]*Layer{top}, older...), base: base, writable: true}
}

// Snapshot freezes the view's top layer: a copy later writes do not
// change.
func (v *View) Snapshot() *Layer { return v.layers[0].snapshot() }

// Mark is a point to roll back to.
type Mark struct{ gen, changes, undos int }

// Mark returns the current point of the writes.
func (v *View) Mark() Mark { return Mark{v.gen, len(v.changes), len(v.undos)} }

// Rollback undoes every write made after m, but none made before the
// last Reset (a Mark from before it rolls back to it).
func (v *View) Rollback(m Mark) {
	if m.gen != v.gen {
		m = Mark{gen: v.gen}
	}
	top := v.layers[0]
	for i := len(v.undos) - 1; i >= m.undos; i-- {
		u := v.undos[i]
		switch {
		case u.isSeq && u.had:
			top.seqs[u.bucket] = u.seq
		case u.isSeq:
			delete(top.seqs, u.bucket)
		case u.had:
			top.tree(u.bucket, true).Set(u.prev)
		default:
			top.tree(u.bucket, true).Delete(u.prev)
		}
	}
	v.undos = v.undos[:m.undos]
	v.writes++
	clear(v.changes[m.changes:])
	v.changes = v.changes[:m.changes]
}

// Changes returns the writes since the view was made or Reset, in order.
// The slice stays as it is after a Reset (later writes do not reuse it).
func (v *View) Changes() []Change { return v.changes }

// Reset forgets the writes made so far (they stay in the layer): the next
// Changes starts after them, and no Rollback goes before them.
func (v *View) Reset() {
	v.changes, v.undos = nil, nil
	v.gen++
}

// Bucket returns the named bucket of the view, or nil if neither a layer
// nor the base has it.
func (v *View) Bucket(name []byte) *Bucket {
	for _, b := range v.buckets {
		if b.name == string(name) {
			return b
		}
	}
	b := &Bucket{v: v, name: string(name)}
	if v.base != nil {
		if bb := v.base.Bucket(name); bb != nil {
			b.base = bb
			v.buckets = append(v.buckets, b)
			return b
		}
	}
	for _, l := range v.layers {
		if l.buckets[b.name] != nil {
			v.buckets = append(v.buckets, b)
			return b
		}
	}
	return nil
}

// Bucket is one bucket of a view.
type Bucket struct {
	v    *View
	name string
	base BaseBucket
}

// Get returns key's value, or nil if absent.
func (b *Bucket) Get(key []byte) []byte {
	for _, l := range b.v.layers {
		if t := l.tree(b.name, false); t != nil {
			if it, ok := t.Get(b.v.probeFor(key)); ok {
				if it.deleted {
					return nil
				}
				return it.value
			}
		}
	}
	if b.base == nil {
		return nil
	}
	return b.base.Get(key)
}

func (b *Bucket) write(key, value []byte, deleted bool) error {
	switch {
	case !b.v.writable:
		return ErrReadOnly
	case len(key) == 0:
		return ErrKeyRequired
	case len(key) > MaxKeySize:
		return ErrKeyTooLarge
	case len(value) > MaxValueSize:
		return ErrValueTooLarge
	}
	// One buffer for the key and the value (copied: layers outlive the
	// transactions whose buffers they came from).
	buf := make([]byte, 0, len(key)+len(value))
	buf = append(append(buf, key...), value...)
	it := &item{key: buf[:len(key):len(key)], deleted: deleted}
	if !deleted {
		it.value = buf[len(key):]
	}
	key, value = it.key, it.value
	t := b.v.layers[0].tree(b.name, true)
	prev, had := t.Set(it)
	if !had {
		prev = it // rolling back deletes by key
	}
	b.v.undos = append(b.v.undos, undo{bucket: b.name, prev: prev, had: had})
	b.v.changes = append(b.v.changes, Change{Bucket: b.name, Key: key, Value: value, Delete: deleted})
	b.v.writes++
	return nil
}

// Put sets key to value (copied).
func (b *Bucket) Put(key, value []byte) error { return b.write(key, value, false) }

// Delete removes key; deleting an absent key is not an error.
func (b *Bucket) Delete(key []byte) error { return b.write(key, nil, true) }

// Sequence returns the bucket's sequence.
func (b *Bucket) Sequence() uint64 {
	for _, l := range b.v.layers {
		if s, ok := l.seqs[b.name]; ok {
			return s
		}
	}
	if b.base == nil {
		return 0
	}
	return b.base.Sequence()
}

// SetSequence sets the bucket's sequence.
func (b *Bucket) SetSequence(seq uint64) error {
	if !b.v.writable {
		return ErrReadOnly
	}
	top := b.v.layers[0]
	prev, had := top.seqs[b.name]
	top.seqs[b.name] = seq
	b.v.undos = append(b.v.undos, undo{bucket: b.name, isSeq: true, had: had, seq: prev})
	b.v.changes = append(b.v.changes, Change{Bucket: b.name, IsSeq: true, Seq: seq})
	return nil
}

// NextSequence increments the bucket's sequence and returns it.
func (b *Bucket) NextSequence() (uint64, error) {
	seq := b.Sequence() + 1
	return seq, b.SetSequence(seq)
}

// ForEach calls fn for every key in order, stopping at its first error.
func (b *Bucket) ForEach(fn func(k, v []byte) error) error {
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

// Cursor returns a cursor over the bucket's merged keys.
func (b *Bucket) Cursor() *Cursor {
	c := &Cursor{b: b}
	if b.base != nil {
		c.base = b.base.Cursor()
	}
	return c
}

// Cursor walks a bucket of a view in key order. A write through the view
// while a cursor is in use is seen by the cursor's next step.
//
// Each source (the layers holding the bucket, newest first, then the
// base) keeps its own position just past the cursor's key in the
// direction of the last move, so a step compares one key per source
// instead of seeking each again. A change of direction, or a write to the
// view since the last move, positions every source again from the key.
type Cursor struct {
	b    *Bucket
	base BaseCursor
	srcs []source
	// key is where the cursor is; nil once a move found no key.
	key     []byte
	forward bool
	ver     uint64 // the view's writes when the sources were positioned
}

// source is one layer's tree or the base, positioned.
type source struct {
	tree *btree.BTreeG[*item]
	iter btree.IterG[*item]
	base BaseCursor
	cur  item
	ok   bool
}

// First moves to the first key.
func (c *Cursor) First() ([]byte, []byte) { return c.move(nil, true, true) }

// Last moves to the last key.
func (c *Cursor) Last() ([]byte, []byte) { return c.move(nil, false, true) }

// Seek moves to the first key at or after seek.
func (c *Cursor) Seek(seek []byte) ([]byte, []byte) { return c.move(seek, true, true) }

// Next moves to the key after the current one.
func (c *Cursor) Next() ([]byte, []byte) { return c.stepFrom(true) }

// Prev moves to the key before the current one.
func (c *Cursor) Prev() ([]byte, []byte) { return c.stepFrom(false) }

func (c *Cursor) stepFrom(forward bool) ([]byte, []byte) {
	if c.key == nil {
		return nil, nil
	}
	if forward != c.forward || c.ver != c.b.v.writes {
		return c.move(c.key, forward, false)
	}
	return c.settle(c.step())
}

// move positions every source from pivot (nil: the start, or the end)
// and takes the nearest visible key.
func (c *Cursor) move(pivot []byte, forward, inclusive bool) ([]byte, []byte) {
	c.forward, c.ver = forward, c.b.v.writes
	// A write may have given the top layer the bucket since the last move.
	c.srcs = c.srcs[:0]
	for _, l := range c.b.v.layers {
		if t := l.tree(c.b.name, false); t != nil {
			c.srcs = append(c.srcs, source{tree: t})
		}
	}
	if c.base != nil {
		c.srcs = append(c.srcs, source{base: c.base})
	}
	for i := range c.srcs {
		c.srcs[i].position(c.b.v.probeFor(pivot), forward, inclusive)
	}
	return c.settle(c.step())
}

func (c *Cursor) settle(it item) ([]byte, []byte) {
	c.key = it.key
	return it.key, it.value
}

// step returns the nearest key the sources hold in the cursor's
// direction, whose state is the newest source's holding it (a deleted key
// is passed over), and moves every source holding it past it.
func (c *Cursor) step() item {
	for {
		best := -1
		for i := range c.srcs {
			s := &c.srcs[i]
			if !s.ok {
				continue
			}
			// Strict: on equal keys the newer source (listed first) wins.
			if best < 0 {
				best = i
			} else if d := bytes.Compare(s.cur.key, c.srcs[best].cur.key); c.forward && d < 0 || !c.forward && d > 0 {
				best = i
			}
		}
		if best < 0 {
			return item{}
		}
		win := c.srcs[best].cur
		for i := range c.srcs {
			if s := &c.srcs[i]; s.ok && bytes.Equal(s.cur.key, win.key) {
				s.advance(c.forward)
			}
		}
		if !win.deleted {
			return win
		}
	}
}

// position puts s on its nearest item from pivot in the direction: at or
// after it going forward (strictly after unless inclusive), at or before
// it going backward; a nil pivot is the start (forward) or the end.
func (s *source) position(probe *item, forward, inclusive bool) {
	pivot := probe.key
	if s.base != nil {
		var k, v []byte
		switch {
		case forward && pivot == nil:
			k, v = s.base.First()
		case forward:
			if k, v = s.base.Seek(pivot); k != nil && !inclusive && bytes.Equal(k, pivot) {
				k, v = s.base.Next()
			}
		case pivot == nil:
			k, v = s.base.Last()
		default:
			k, v = s.base.Seek(pivot)
			switch {
			case k == nil:
				k, v = s.base.Last()
			case !(inclusive && bytes.Equal(k, pivot)):
				k, v = s.base.Prev()
			}
		}
		s.cur, s.ok = item{key: k, value: v}, k != nil
		return
	}
	s.iter = s.tree.Iter()
	var ok bool
	switch {
	case forward && pivot == nil:
		ok = s.iter.First()
	case forward:
		if ok = s.iter.Seek(probe); ok && !inclusive && bytes.Equal(s.iter.Item().key, pivot) {
			ok = s.iter.Next()
		}
	case pivot == nil:
		ok = s.iter.Last()
	default:
		ok = s.iter.Seek(probe)
		switch {
		case !ok:
			ok = s.iter.Last()
		case !(inclusive && bytes.Equal(s.iter.Item().key, pivot)):
			ok = s.iter.Prev()
		}
	}
	s.ok = ok
	if ok {
		s.cur = *s.iter.Item()
	}
}

// advance moves s one item on in the direction.
func (s *source) advance(forward bool) {
	if s.base != nil {
		var k, v []byte
		if forward {
			k, v = s.base.Next()
		} else {
			k, v = s.base.Prev()
		}
		s.cur, s.ok = item{key: k, value: v}, k != nil
		return
	}
	if forward {
		s.ok = s.iter.Next()
	} else {
		s.ok = s.iter.Prev()
	}
	if s.ok {
		s.cur = *s.iter.Item()
	}
}

// Writable reports whether the view takes writes.
func (v *View) Writable() bool { return v.writable }

// ID is the number its maker gave the view (SetID): the store numbers
// views as bbolt numbers transactions, so a read can tell whether a
// write's view is newer than its own.
func (v *View) ID() int { return v.id }

// SetID sets ID.
func (v *View) SetID(id int) { v.id = id }
