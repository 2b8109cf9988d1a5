package valkey

import (
	"sync"

	"github.com/starintel/starlease/lease"
)

// recordMemo remembers strictly decoded records by their exact bytes.
// lease.DecodeRecord is a pure function of the bytes, so a hit is exactly
// its result; any other bytes take the full strict path. Rereading an
// unchanged record (inspect, a replay's current state) then costs a map
// lookup instead of a strict JSON decode, which is most of a read's CPU on
// the adapter side. Only successful decodes are kept; a hit returns a deep
// copy, so callers may modify what they get. Bounded at recordMemoMax
// entries (about 1.5 KB each); a full memo drops an arbitrary entry.
type recordMemo struct {
	mu sync.Mutex
	m  map[string]*lease.Record
}

const recordMemoMax = 2048

func (mm *recordMemo) decode(raw []byte) (*lease.Record, error) {
	mm.mu.Lock()
	rec, ok := mm.m[string(raw)]
	mm.mu.Unlock()
	if ok {
		return rec.Clone(), nil
	}
	rec, err := lease.DecodeRecord(raw)
	if err != nil {
		return nil, err
	}
	kept := rec.Clone()
	mm.mu.Lock()
	if mm.m == nil {
		mm.m = make(map[string]*lease.Record)
	}
	if len(mm.m) >= recordMemoMax {
		for k := range mm.m {
			delete(mm.m, k)
			break
		}
	}
	mm.m[string(raw)] = kept
	mm.mu.Unlock()
	return rec, nil
}
