package bolt

import (
	"errors"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/starintel/starlease/internal/layered"
)

// The store reads and writes through layered views: a writer's writes go
// to an in-memory layer over a bbolt transaction, and reach the tree when
// the layer is applied to it. Today a layer is applied in the
// transaction that made it (direct); the views are the seam where a
// redo log and a later, shared flush of many batches' layers go in.

// baseOf is a bbolt transaction as a view's base.
type baseOf struct{ tx *bbolt.Tx }

func (b baseOf) Bucket(name []byte) layered.BaseBucket {
	if bk := b.tx.Bucket(name); bk != nil {
		return baseBucket{bk}
	}
	return nil
}

type baseBucket struct{ b *bbolt.Bucket }

func (b baseBucket) Get(k []byte) []byte        { return b.b.Get(k) }
func (b baseBucket) Cursor() layered.BaseCursor { return b.b.Cursor() }
func (b baseBucket) Sequence() uint64           { return b.b.Sequence() }

// direct runs fn on a writer over tx and applies its writes to tx, unless
// fn fails (then tx is left as it was).
func direct(tx *bbolt.Tx, fn func(*layered.View) error) error {
	return directAs(tx, int(tx.ID()), fn)
}

// directAs is direct with the writer's ID (the store's clock orders
// reads and writes by it) given.
func directAs(tx *bbolt.Tx, id int, fn func(*layered.View) error) error {
	top := layered.NewLayer()
	w := layered.NewWriter(baseOf{tx}, top)
	w.SetID(id)
	if err := fn(w); err != nil {
		return err
	}
	return applyLayer(tx, top)
}

// readView is a read-only view of tx.
func readView(tx *bbolt.Tx) *layered.View {
	v := layered.NewView(baseOf{tx})
	v.SetID(int(tx.ID()))
	return v
}

// applyLayer writes l's keys and sequences to tx.
func applyLayer(tx *bbolt.Tx, l *layered.Layer) error {
	bucket := func(name string) (*bbolt.Bucket, error) {
		if b := tx.Bucket([]byte(name)); b != nil {
			return b, nil
		}
		return nil, fmt.Errorf("%w: %q", errNoBucket, name)
	}
	return l.Apply(
		func(name string, k, v []byte) error {
			b, err := bucket(name)
			if err != nil {
				return err
			}
			return b.Put(k, v)
		},
		func(name string, k []byte) error {
			b, err := bucket(name)
			if err != nil {
				return err
			}
			return b.Delete(k)
		},
		func(name string, seq uint64) error {
			b, err := bucket(name)
			if err != nil {
				return err
			}
			return b.SetSequence(seq)
		})
}

// errNoBucket is a layer's write to a bucket the tree lacks: a view
// finds only buckets its base has, so only a bug gets here.
var errNoBucket = errors.New("write to a bucket the store file lacks")
