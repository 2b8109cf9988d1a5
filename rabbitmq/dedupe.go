package rabbitmq

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/starintel/starlease/internal/syncdir"
	"github.com/starintel/starlease/lease"
)

// Defaults of DeduperOptions.
const (
	DefaultMaxLockKeys   = 1024
	DefaultIDsPerLockKey = 128
)

// DeduperOptions bounds a Deduper's memory. Zero values mean the defaults.
type DeduperOptions struct {
	// MaxLockKeys is how many lock keys are tracked. When a new lock key
	// would exceed it, the least recently seen one is forgotten, with its
	// highest token and its message ids.
	MaxLockKeys int
	// IDsPerLockKey is how many of the most recent accepted message ids are
	// remembered per lock key (a ring). A duplicate that arrives after more
	// than this many newer publications of its lock key is not recognised
	// as a duplicate (its token still has to pass the token check).
	IDsPerLockKey int
}

// Verdict is a Deduper's decision about one delivery.
type Verdict string

// The verdicts. Every verdict but Process means: acknowledge the delivery
// without processing it.
const (
	// Process: the delivery is new and its token is not below the highest
	// seen for its lock key.
	Process Verdict = "process"
	// DropDuplicate: a delivery with this message id was already accepted.
	DropDuplicate Verdict = "duplicate"
	// DropStaleToken: the token is below the highest token seen for the
	// lock key, or equal to it but from a different lease.
	DropStaleToken Verdict = "stale_token"
	// DropUnfenced: the delivery has no complete, well-formed fence.
	DropUnfenced Verdict = "unfenced"
)

// Decision is a verdict with its reason.
type Decision struct {
	Verdict Verdict
	// Fence is the delivery's fence (zero for DropUnfenced).
	Fence Fence
	// Highest is the highest token seen for the lock key before this
	// delivery (0 if none).
	Highest uint64
	// Reason says why, for logs.
	Reason string
}

// Dropped reports whether the delivery is to be acknowledged unprocessed.
func (d Decision) Dropped() bool { return d.Verdict != Process }

// Deduper is the consumer-side filter of fenced publications: it drops
// duplicates by message id and deliveries whose fencing token is below the
// highest token seen for their lock key. It is safe for concurrent use.
//
// # Defence in depth, not the authority
//
// The Deduper reads delivery metadata: the message id and the fence headers
// the relay set. Anyone who can publish to the exchange can forge them, and
// the Deduper's memory is bounded and lost on restart. It therefore does NOT
// provide stale-holder exclusion and must never be presented as fencing (the
// contract forbids claiming exclusion for a path that trusts RabbitMQ
// delivery metadata). The authority is the fenced outbox: a publication
// enters it only in the same atomic operation as an accepted lease check
// (Publisher.Publish), so a stale holder's publication never reaches the
// relay. What the Deduper adds is that a consumer processes each accepted
// publication once within its window, despite the relay's at-least-once
// delivery, and never goes back to an older holder's result that it sees
// late (a lower token than one it already processed for that lock key).
//
// A consumer whose effects must be exactly-once beyond the window, or across
// its own restarts, records the message id with its effect (for example in
// a fenced CouchDB document) and checks it there.
//
// # Memory
//
// At most MaxLockKeys lock keys are tracked, least recently seen evicted
// first; for each, its highest token (with the lease id that holds it) and a
// ring of its IDsPerLockKey most recent accepted message ids. The memory is
// thus bounded by MaxLockKeys × IDsPerLockKey message ids (with the
// defaults 1024 × 128, about 131 000 ids of some 50 bytes each). Forgetting
// a lock key forgets its highest token too: a later delivery for it is
// judged as if first seen.
type Deduper struct {
	maxKeys, perKey int

	mu   sync.Mutex
	keys map[string]*list.Element // of *keyState
	lru  *list.List               // front: most recently seen
}

type keyState struct {
	lockKey   string
	high      uint64
	highLease string
	ids       map[string]struct{}
	ring      []string // grows to size, then wraps
	size      int
	next      int
}

// NewDeduper returns an empty Deduper.
func NewDeduper(o DeduperOptions) *Deduper {
	if o.MaxLockKeys <= 0 {
		o.MaxLockKeys = DefaultMaxLockKeys
	}
	if o.IDsPerLockKey <= 0 {
		o.IDsPerLockKey = DefaultIDsPerLockKey
	}
	return &Deduper{maxKeys: o.MaxLockKeys, perKey: o.IDsPerLockKey, keys: map[string]*list.Element{}, lru: list.New()}
}

// Check decides about a delivery. A delivery it passes (Process) is
// recorded at once: its message id is remembered and the lock key's highest
// token raised, so a concurrent duplicate is dropped. If processing then
// fails and the delivery is requeued, call Forget so the redelivery is
// processed.
func (d *Deduper) Check(del amqp.Delivery) Decision {
	f, err := FenceOf(del)
	if err != nil {
		return Decision{Verdict: DropUnfenced, Reason: err.Error()}
	}
	return d.check(f)
}

func (d *Deduper) check(f Fence) Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	ks := d.state(f.LockKey)
	dec := Decision{Fence: f, Highest: ks.high}
	switch _, dup := ks.ids[f.MessageID]; {
	case dup:
		dec.Verdict, dec.Reason = DropDuplicate, "message id "+f.MessageID+" was already accepted"
	case f.FencingToken < ks.high:
		dec.Verdict, dec.Reason = DropStaleToken, fmt.Sprintf("fencing token %d is below %d, the highest seen for the lock key", f.FencingToken, ks.high)
	case f.FencingToken == ks.high && f.LeaseID != ks.highLease:
		dec.Verdict, dec.Reason = DropStaleToken, fmt.Sprintf("fencing token %d belongs to another lease", f.FencingToken)
	default:
		dec.Verdict, dec.Reason = Process, "new publication, token not below the highest seen"
		ks.high, ks.highLease = f.FencingToken, f.LeaseID
		ks.remember(f.MessageID)
	}
	return dec
}

// Forget removes a message id that Check passed from the remembered ids,
// so that a redelivery of it is processed. The highest token stays.
func (d *Deduper) Forget(f Fence) {
	d.mu.Lock()
	defer d.mu.Unlock()
	el, ok := d.keys[f.LockKey]
	if !ok {
		return
	}
	ks := el.Value.(*keyState)
	if _, ok := ks.ids[f.MessageID]; !ok {
		return
	}
	delete(ks.ids, f.MessageID)
	for i, id := range ks.ring {
		if id == f.MessageID {
			ks.ring[i] = ""
		}
	}
}

// Handle checks a delivery and settles it: a dropped delivery is
// acknowledged without calling process; otherwise process runs and the
// delivery is acknowledged if it returns nil, or forgotten and rejected
// with requeue if it returns an error. It returns the decision and the
// error of process or of the acknowledgement.
func (d *Deduper) Handle(del amqp.Delivery, process func(Fence, amqp.Delivery) error) (Decision, error) {
	dec := d.Check(del)
	if dec.Dropped() {
		return dec, del.Ack(false)
	}
	if err := process(dec.Fence, del); err != nil {
		d.Forget(dec.Fence)
		if nerr := del.Nack(false, true); nerr != nil {
			return dec, fmt.Errorf("%w (and requeue failed: %v)", err, nerr)
		}
		return dec, err
	}
	return dec, del.Ack(false)
}

// Highest returns the highest token seen for a lock key (0 if none or
// forgotten).
func (d *Deduper) Highest(lockKey string) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.keys[lockKey]; ok {
		return el.Value.(*keyState).high
	}
	return 0
}

// Marks returns the highest token of every tracked lock key: the
// consumer's downstream high-water marks, which it persists
// (WriteMarksFile) as its consumer record for recovery
// (recovery.MarksFileProof).
//
// Only tracked lock keys are included: a key the Deduper forgot
// (MaxLockKeys) is missing, so a consumer that persists marks writes, per
// key, the maximum of Marks and what it persisted before (ReadMarksFile).
// Keys that are not canonical lock keys (CheckLockKey) are left out: Check
// admits any key with the lock key prefix, but no lease can hold such a
// key, so it is no evidence, and one forged delivery must not keep the
// consumer from persisting its marks.
func (d *Deduper) Marks() map[string]uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]uint64, len(d.keys))
	for k, el := range d.keys {
		if h := el.Value.(*keyState).high; h > 0 && CheckLockKey(k) == nil {
			out[k] = h
		}
	}
	return out
}

// Len returns how many lock keys are tracked.
func (d *Deduper) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lru.Len()
}

// state returns the state of lockKey, marking it most recently seen and
// evicting the least recently seen key beyond the bound.
func (d *Deduper) state(lockKey string) *keyState {
	if el, ok := d.keys[lockKey]; ok {
		d.lru.MoveToFront(el)
		return el.Value.(*keyState)
	}
	for d.lru.Len() >= d.maxKeys {
		old := d.lru.Back()
		delete(d.keys, old.Value.(*keyState).lockKey)
		d.lru.Remove(old)
	}
	ks := &keyState{lockKey: lockKey, ids: map[string]struct{}{}, size: d.perKey}
	d.keys[lockKey] = d.lru.PushFront(ks)
	return ks
}

// remember adds id to the ring, evicting the oldest id once it is full.
func (ks *keyState) remember(id string) {
	ks.ids[id] = struct{}{}
	if len(ks.ring) < ks.size {
		ks.ring = append(ks.ring, id)
		return
	}
	if old := ks.ring[ks.next]; old != "" {
		delete(ks.ids, old)
	}
	ks.ring[ks.next] = id
	ks.next = (ks.next + 1) % ks.size
}

// CheckLockKey reports whether key has the shape of a canonical lock key:
// lease.CheckLockKey, which the fence headers' own check (FenceOf, the
// prefix only) does not apply.
func CheckLockKey(key string) error { return lease.CheckLockKey(key) }

// ErrMalformedMarks is wrapped by every *MarksError.
var ErrMalformedMarks = errors.New("rabbitmq: malformed consumer marks")

// MarksError reports consumer marks that break the marks file format,
// read from a file or about to be written to one.
type MarksError struct {
	Path    string // the marks file
	LockKey string // the entry at fault, if one is
	Reason  string
}

func (e *MarksError) Error() string {
	if e.LockKey != "" {
		k := e.LockKey
		if len(k) > 100 {
			k = k[:100] + "..."
		}
		return fmt.Sprintf("rabbitmq: consumer marks %s: lock key %q: %s", e.Path, k, e.Reason)
	}
	return fmt.Sprintf("rabbitmq: consumer marks %s: %s", e.Path, e.Reason)
}

// Unwrap makes errors.Is(err, ErrMalformedMarks) hold.
func (e *MarksError) Unwrap() error { return ErrMalformedMarks }

// checkMark checks one entry of a marks file.
func checkMark(path, key string, token uint64) error {
	if err := CheckLockKey(key); err != nil {
		return &MarksError{Path: path, LockKey: key, Reason: err.Error()}
	}
	if token < 1 || token > lease.MaxFencingToken {
		return &MarksError{Path: path, LockKey: key, Reason: "fencing token out of range 1..2^53-1"}
	}
	return nil
}

// WriteMarksFile replaces the marks file at path with marks: one JSON
// object, canonical lock key → highest fencing token (1..2^53-1), keys
// sorted. It writes a temporary file in the same directory (mode 0600),
// fsyncs it, renames it over path and fsyncs the directory, so a crash
// leaves either the old file or the new one, never a torn one. Marks that
// ReadMarksFile would refuse are not written (*MarksError).
func WriteMarksFile(path string, marks map[string]uint64) error {
	for k, t := range marks {
		if err := checkMark(path, k, t); err != nil {
			return err
		}
	}
	if marks == nil {
		marks = map[string]uint64{} // "{}", not "null"
	}
	b, err := json.Marshal(marks)
	if err != nil {
		return fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	_, werr := f.Write(append(b, '\n'))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	// The rename is durable only once the directory is.
	if err := syncdir.Sync(dir); err != nil {
		return fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	return nil
}

// ReadMarksFile reads a marks file (WriteMarksFile) strictly: it must hold
// exactly one JSON object whose keys are distinct canonical lock keys
// (CheckLockKey) and whose values are integer literals in 1..2^53-1.
// Anything else — another JSON shape, a string, fraction, exponent or
// negative token, a duplicate key, trailing data, an empty file — is a
// *MarksError: a consumer record that cannot be read exactly proves
// nothing. An empty object is valid (the consumer has seen nothing). I/O
// errors are returned as they are (errors.Is(err, fs.ErrNotExist) holds
// for a missing file).
func ReadMarksFile(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: consumer marks %s: %w", path, err)
	}
	bad := func(reason string) error { return &MarksError{Path: path, Reason: reason} }
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, bad("not a JSON object")
	}
	marks := map[string]uint64{}
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return nil, bad("not valid JSON")
		}
		if _, dup := marks[key]; dup {
			return nil, &MarksError{Path: path, LockKey: key, Reason: "duplicate key"}
		}
		tok, err = dec.Token()
		if err != nil {
			return nil, bad("not valid JSON")
		}
		num, ok := tok.(json.Number)
		if !ok || strings.ContainsAny(string(num), ".eE") {
			return nil, &MarksError{Path: path, LockKey: key, Reason: "fencing token is not an integer"}
		}
		t, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil {
			t = 0 // negative or beyond uint64: out of range below
		}
		if err := checkMark(path, key, t); err != nil {
			return nil, err
		}
		marks[key] = t
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, bad("not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("trailing data after the object")
	}
	return marks, nil
}
