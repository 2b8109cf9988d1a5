package lease

import "sync"

// RecordMemo remembers strictly decoded records by their exact bytes. Its
// decoder (DecodeRecord, or DecodeStoredRecord where records are stored
// in either version) is a pure function of the bytes, so a hit is exactly
// its result; any other bytes take the full strict path. Rereading an
// unchanged record (inspect, a replay's current state, the release of a
// lease just acquired) then costs a map lookup instead of a strict decode,
// which is most of a read's CPU. Only successful decodes are kept; a hit
// returns a deep copy, so callers may modify what they get. Bounded at
// RecordMemoMax entries (about 1.5 KB each); a full memo drops an
// arbitrary entry. Safe for concurrent use.
type RecordMemo struct {
	decode func([]byte) (*Record, error)
	mu     sync.Mutex
	m      map[string]*Record
}

// RecordMemoMax bounds a RecordMemo.
const RecordMemoMax = 2048

// NewRecordMemo returns a memo of decode.
func NewRecordMemo(decode func([]byte) (*Record, error)) *RecordMemo {
	return &RecordMemo{decode: decode, m: make(map[string]*Record)}
}

// Decode returns what the memo's decoder returns for raw.
func (mm *RecordMemo) Decode(raw []byte) (*Record, error) {
	if rec, ok := mm.Known(raw); ok {
		return rec, nil
	}
	rec, err := mm.decode(raw)
	if err != nil {
		return nil, err
	}
	kept := rec.Clone()
	mm.mu.Lock()
	if len(mm.m) >= RecordMemoMax {
		for k := range mm.m {
			delete(mm.m, k)
			break
		}
	}
	mm.m[string(raw)] = kept
	mm.mu.Unlock()
	return rec, nil
}

// Known returns a copy of the record remembered for raw, without decoding
// on a miss: for a caller that would decode a miss itself and not keep it.
func (mm *RecordMemo) Known(raw []byte) (*Record, bool) {
	mm.mu.Lock()
	rec, ok := mm.m[string(raw)]
	mm.mu.Unlock()
	if !ok {
		return nil, false
	}
	return rec.Clone(), true
}

// Len is the number of records the memo holds.
func (mm *RecordMemo) Len() int {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return len(mm.m)
}
