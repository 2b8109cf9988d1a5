// Package redolog is an append-only log of records, each made durable by
// one fdatasync before its writer is answered: what lets a store
// acknowledge a batch of writes before its tree commits them (see
// internal/layered), and redo them after a crash.
//
// The log is a directory of segment files, each preallocated (so an
// fdatasync of an append has no file size to record) and named by the
// sequence number of its first record. A segment starts with a random
// 8-byte salt (and 8 bytes reserved); a record is
//
//	length u32 | crc32c(salt ‖ seq ‖ payload) u32 | seq u64 | payload
//
// big-endian, with seq counting up by one from record to record across
// segments. The salt keeps bytes a record carries (a client's value) from
// ever checking as a record of their own. A record is written only after the previous one is durable,
// so a crash can tear only the last record of the last segment: Open
// takes a record that does not check (or a zero length) at the end of the
// last segment as the end of the log, and cuts it off. (Damage confined
// to the last record reads the same: no log can tell it from a torn
// write.) A record that does
// not check anywhere else, a gap in the sequence, or a segment that does
// not start where the previous one ended, is damage to acknowledged
// writes: Open fails (ErrCorrupt) rather than replay around it. What no
// log can see is the loss of its last records with nothing after them
// (a whole last segment removed): the caller checks that the records it
// needs start where its tree ends.
package redolog

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/starintel/starlease/internal/syncdir"
)

const (
	headerSize = 16
	segHeader  = 16 // salt u64, reserved u64
	maxSegment = 1 << 32
	// DefaultSegmentSize is a segment's preallocated size.
	DefaultSegmentSize = 64 << 20
	suffix             = ".redo"
)

var (
	// ErrCorrupt marks a log whose acknowledged records cannot all be
	// read back.
	ErrCorrupt = errors.New("redolog: the log is damaged")
	// ErrTooLarge marks a record that does not fit a segment.
	ErrTooLarge = errors.New("redolog: record larger than a segment")
	// ErrFailed marks a log whose last append failed: what reached the
	// file is unknown, so it takes no more records until Recover (or
	// reopening) settles it.
	ErrFailed = errors.New("redolog: an earlier append failed; recover or reopen the log")
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Options configures a Log.
type Options struct {
	// SegmentSize is each segment's size; zero means DefaultSegmentSize.
	// At most 4 GiB (a record's length is 32 bits).
	SegmentSize int64
}

// Log appends records. It is not safe for concurrent use: one writer
// appends (the store's committer).
type Log struct {
	dir  string
	opts Options

	segs   []segment // oldest first; the last one takes appends
	f      *os.File  // the last segment, open for writing
	salt   []byte    // its salt
	off    int64     // end of its last record
	dirty  int64     // at Open, end of its last nonzero byte
	next   uint64    // seq of the next record
	failed error
	// failedEnd is where the failed append's bytes may reach in f.
	failedEnd int64
	closed    bool
	// frame is the buffer appends frame their record in, kept between
	// appends up to maxKeptFrame bytes (one per append would be garbage).
	frame []byte
	// removedUnsynced is set while segments Remove deleted may not be
	// durably gone (their directory's fsync failed or never ran): the
	// next Remove syncs the directory even with nothing to delete. Only
	// Remove uses it, and Removes do not overlap.
	removedUnsynced atomic.Bool
}

// syncDir is syncdir.Sync; tests count its calls.
var syncDir = syncdir.Sync

const maxKeptFrame = 1 << 20

type segment struct {
	first uint64 // seq of its first record
	path  string
	salt  []byte // read by readSegment
}

// Record is one record read back.
type Record struct {
	Seq     uint64
	Payload []byte
}

// Open opens (creating if needed) the log in dir and reads back every
// record it holds, oldest first; the caller redoes those it needs. An
// empty log's first record will have sequence number first.
func Open(dir string, first uint64, o Options) (*Log, []Record, error) {
	if o.SegmentSize <= 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.SegmentSize > maxSegment || o.SegmentSize < segHeader+headerSize {
		return nil, nil, fmt.Errorf("redolog: segment size %d out of range", o.SegmentSize)
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
		// The new directory's entry must outlast a crash with the
		// records it will hold.
		if err := syncdir.Sync(filepath.Dir(dir)); err != nil {
			return nil, nil, err
		}
	}
	segs, err := listSegments(dir)
	if err != nil {
		return nil, nil, err
	}
	l := &Log{dir: dir, opts: o, segs: segs, next: first}
	var recs []Record
	var prevEnd, prevDirty int64
	for i, s := range segs {
		last := i == len(segs)-1
		if len(recs) > 0 || i > 0 {
			if s.first != l.next {
				return nil, nil, fmt.Errorf("%w: segment %s starts at %d, want %d", ErrCorrupt, filepath.Base(s.path), s.first, l.next)
			}
		}
		if last && i > 0 {
			unfinished, err := unfinishedSegment(s.path)
			if err != nil {
				return nil, nil, err
			}
			if unfinished {
				// A crash cut the creation of the segment after the
				// previous one filled short: it holds no record, and
				// appending to it would write records under a salt it
				// does not have. The previous one takes appends again.
				if err := os.Remove(s.path); err != nil {
					return nil, nil, err
				}
				if err := syncdir.Sync(dir); err != nil {
					return nil, nil, err
				}
				segs = segs[:i]
				l.segs = segs
				l.off, l.dirty = prevEnd, prevDirty
				break
			}
		}
		l.next = s.first
		got, end, dirty, err := readSegment(&segs[i], last)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range got {
			if r.Seq != l.next {
				return nil, nil, fmt.Errorf("%w: record %d where %d was due in %s", ErrCorrupt, r.Seq, l.next, filepath.Base(s.path))
			}
			l.next++
		}
		recs = append(recs, got...)
		prevEnd, prevDirty = end, dirty
		if last {
			l.off, l.dirty = end, dirty
		}
	}
	if len(recs) == 0 {
		// No record anywhere (segments a crash left before their first
		// record): the log starts afresh at first.
		for _, s := range segs {
			if err := os.Remove(s.path); err != nil {
				return nil, nil, err
			}
		}
		// The first append makes a segment: a log only read (a short
		// command, a store closed cleanly) never writes one.
		l.segs, l.next = nil, first
		return l, nil, nil
	}
	f, err := os.OpenFile(segs[len(segs)-1].path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	l.f, l.salt = f, segs[len(segs)-1].salt
	// Cut a torn tail: the next append starts on zeros.
	if err := l.zero(l.off, l.dirty); err != nil {
		f.Close()
		return nil, nil, err
	}
	return l, recs, nil
}

// Next is the sequence number the next Append gets.
func (l *Log) Next() uint64 { return l.next }

// Append writes payload as the next record and makes it durable. On
// error the record may or may not be in the file, and the log takes no
// more appends (ErrFailed) until reopened.
func (l *Log) Append(payload []byte) (uint64, error) {
	if l.failed != nil {
		return 0, fmt.Errorf("%w: %v", ErrFailed, l.failed)
	}
	if l.closed {
		return 0, os.ErrClosed
	}
	size := int64(headerSize + len(payload))
	if size > l.opts.SegmentSize-segHeader {
		return 0, ErrTooLarge
	}
	if l.f == nil || l.off+size > l.opts.SegmentSize {
		if err := l.newSegment(); err != nil {
			l.failed = err
			return 0, err
		}
	}
	seq := l.next
	buf := l.frame
	if int64(cap(buf)) < size {
		buf = make([]byte, size)
		if size <= maxKeptFrame {
			l.frame = buf
		}
	}
	buf = buf[:size]
	l.encode(buf, seq, payload)
	if _, err := l.f.WriteAt(buf, l.off); err != nil {
		l.failed, l.failedEnd = err, l.off+size
		return 0, err
	}
	if err := fdatasync(l.f); err != nil {
		l.failed, l.failedEnd = err, l.off+size
		return 0, err
	}
	l.off += size
	l.next++
	return seq, nil
}

// Recover makes a log whose append failed take appends again, once it
// can be sure the failed record is not in the file: it overwrites every
// byte the record may have reached with zeros and makes that durable
// (Open reads a zero length as the end of the log). The record is then
// never redone, and the next append takes its number. It fails, leaving
// the log failed, while the zeros cannot be written (the disk still
// full).
func (l *Log) Recover() error {
	if l.closed {
		return os.ErrClosed
	}
	if l.failed == nil {
		return nil
	}
	if err := l.zero(l.off, l.failedEnd); err != nil {
		return err
	}
	l.failed, l.failedEnd = nil, 0
	return nil
}

// encode writes record seq of payload to buf (headerSize+len(payload)).
func (l *Log) encode(buf []byte, seq uint64, payload []byte) {
	binary.BigEndian.PutUint32(buf[0:], uint32(len(payload)))
	binary.BigEndian.PutUint64(buf[8:], seq)
	copy(buf[headerSize:], payload)
	binary.BigEndian.PutUint32(buf[4:], checksum(l.salt, buf[8:]))
}

func checksum(salt, seqAndPayload []byte) uint32 {
	return crc32.Update(crc32.Checksum(salt, table), table, seqAndPayload)
}

// Drop deletes the segments whose records all have sequence numbers
// below upTo (the tree holds them now). The segment taking appends stays.
func (l *Log) Drop(upTo uint64) error {
	deleted, err := l.Remove(l.Obsolete(upTo))
	l.Forget(deleted)
	return err
}

// Obsolete returns the paths of the segments whose records all have
// sequence numbers below upTo, oldest first: what Drop deletes. The
// segment taking appends is never one.
func (l *Log) Obsolete(upTo uint64) []string {
	var paths []string
	for i := 0; i+1 < len(l.segs) && l.segs[i+1].first <= upTo; i++ {
		paths = append(paths, l.segs[i].path)
	}
	return paths
}

// Remove deletes the segment files paths (Obsolete's), oldest first, and
// makes their removal durable; it returns the ones it deleted, which the
// caller then Forgets. It reads nothing an append changes, so it may run
// while another goroutine appends (Obsolete and Forget may not): a
// preallocated segment's unlink frees its blocks, which under write load
// took 42 ms, and appends need not wait for that. With nothing to delete
// it syncs the directory only if an earlier Remove's deletions may not be
// durable yet: the store calls it at every flush, and each fsync of the
// directory is a flush of the disk's cache beside the appends' own.
func (l *Log) Remove(paths []string) (deleted []string, err error) {
	if len(paths) == 0 && !l.removedUnsynced.Load() {
		return nil, nil
	}
	for i, p := range paths {
		if err := os.Remove(p); err != nil {
			if i > 0 {
				l.removedUnsynced.Store(true)
			}
			return paths[:i], err
		}
	}
	if err := syncDir(l.dir); err != nil {
		l.removedUnsynced.Store(true)
		return paths, err
	}
	l.removedUnsynced.Store(false)
	return paths, nil
}

// Forget takes the segments Remove deleted off the log: the oldest ones,
// each only if it is the next of deleted, so a list changed in between
// loses no other segment.
func (l *Log) Forget(deleted []string) {
	for len(deleted) > 0 && len(l.segs) > 0 && l.segs[0].path == deleted[0] {
		l.segs, deleted = l.segs[1:], deleted[1:]
	}
}

// Reset removes every segment: the caller's tree holds every record
// (a clean close). The log goes on at the same number, and its next
// append makes a new segment.
func (l *Log) Reset() error {
	if l.closed {
		return os.ErrClosed
	}
	if l.failed != nil {
		return fmt.Errorf("%w: %v", ErrFailed, l.failed)
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	for _, s := range l.segs {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.failed = err
			return err
		}
	}
	l.segs = nil
	return syncdir.Sync(l.dir)
}

// Close closes the log.
func (l *Log) Close() error {
	l.closed = true
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

func (l *Log) newSegment() (err error) {
	path := filepath.Join(l.dir, fmt.Sprintf("%016x%s", l.next, suffix))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// It holds no record: gone, a later try can make it again.
			f.Close()
			os.Remove(path)
		}
	}()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, l.opts.SegmentSize); err != nil {
		if err := f.Truncate(l.opts.SegmentSize); err != nil {
			return err
		}
	}
	salt := make([]byte, 8)
	if _, err := rand.Read(salt); err != nil {
		return err
	}
	if _, err := f.WriteAt(salt, 0); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := syncdir.Sync(l.dir); err != nil {
		return err
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.off, l.salt = f, segHeader, salt
	l.segs = append(l.segs, segment{first: l.next, path: path, salt: salt})
	return nil
}

// zero overwrites the last segment's bytes [off, end) with zeros, so a
// torn record is gone before appends resume at off.
func (l *Log) zero(off, end int64) error {
	if end <= off {
		return nil
	}
	if _, err := l.f.WriteAt(make([]byte, end-off), off); err != nil {
		return err
	}
	return fdatasync(l.f)
}

// readSegment reads a segment's records, the offset after the last, and
// the end of its last nonzero byte. In the last segment, a record that
// does not check ends the log (a torn write) unless a record that checks
// follows it; elsewhere it is damage.
func readSegment(s *segment, last bool) (recs []Record, end, dirty int64, err error) {
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, 0, 0, err
	}
	if len(data) < segHeader {
		if last {
			// A crash while the segment was being created: no record.
			return nil, 0, 0, nil
		}
		return nil, 0, 0, fmt.Errorf("%w: segment %s is shorter than its header", ErrCorrupt, filepath.Base(s.path))
	}
	s.salt = data[:8]
	dirty = int64(len(data))
	for dirty > segHeader && data[dirty-1] == 0 {
		dirty--
	}
	off := int64(segHeader)
	for {
		next := s.first + uint64(len(recs))
		r, size, ok := parseRecord(s.salt, data[off:], next, next)
		if !ok {
			if last && followedByNext(data, off, next) {
				// Framed as record next and followed by record next+1:
				// not the last written, so damage (to it, or to the
				// salt every checksum of the segment uses).
				return nil, 0, 0, fmt.Errorf("%w: record %d at offset %d of %s does not check", ErrCorrupt, next, off, filepath.Base(s.path))
			}
			if off >= dirty || last && !laterRecord(s.salt, data, off+1, dirty, next+1) {
				return recs, off, dirty, nil
			}
			return nil, 0, 0, fmt.Errorf("%w: a record at offset %d of %s does not check", ErrCorrupt, off, filepath.Base(s.path))
		}
		recs = append(recs, r)
		off += size
	}
}

// followedByNext reports whether the bytes at off are framed as record
// seq (its number, which the checksum does not guard, and a nonzero
// length within data) and the frame after it as record seq+1. A torn
// record is the last written: nothing but zeros follows the end its
// length gives. (A length torn to zero is no frame: the bytes after it
// are its own payload.)
func followedByNext(data []byte, off int64, seq uint64) bool {
	frame := func(at int64, want uint64) (int64, bool) {
		if at < 0 || at+headerSize > int64(len(data)) {
			return 0, false
		}
		n := int64(binary.BigEndian.Uint32(data[at:]))
		if n == 0 && want == seq {
			return 0, false
		}
		if binary.BigEndian.Uint64(data[at+8:]) != want || at+headerSize+n > int64(len(data)) {
			return 0, false
		}
		return at + headerSize + n, true
	}
	end, ok := frame(off, seq)
	if !ok {
		return false
	}
	_, ok = frame(end, seq+1)
	return ok
}

// unfinishedSegment reports whether the segment at path was never
// finished: shorter than its header, or its salt not written (a random
// salt is never all zeros in practice).
func unfinishedSegment(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, segHeader)
	n, _ := f.ReadAt(head, 0)
	return n < segHeader || bytes.Equal(head[:8], make([]byte, 8)), nil
}

// laterRecord reports whether a record that checks starts anywhere in
// data from off: then the bad one before it was not the last written,
// so it was acknowledged, and the log is damaged, not torn.
// Only records numbered from minSeq count: the one torn had the number
// before, and the cheap comparison spares a checksum at nearly every
// offset (a scan of a long torn record stays linear).
func laterRecord(salt, data []byte, off, dirty int64, minSeq uint64) bool {
	for ; off < dirty; off++ {
		if _, _, ok := parseRecord(salt, data[off:], minSeq, minSeq+1<<32); ok {
			return true
		}
	}
	return false
}

// parseRecord reads the record at the start of b if it checks and its
// number is within [minSeq, maxSeq].
func parseRecord(salt, b []byte, minSeq, maxSeq uint64) (Record, int64, bool) {
	if len(b) < headerSize {
		return Record{}, 0, false
	}
	n := int64(binary.BigEndian.Uint32(b[0:]))
	seq := binary.BigEndian.Uint64(b[8:])
	if seq < minSeq || seq > maxSeq || headerSize+n > int64(len(b)) {
		return Record{}, 0, false
	}
	if checksum(salt, b[8:headerSize+n]) != binary.BigEndian.Uint32(b[4:]) {
		return Record{}, 0, false
	}
	return Record{Seq: seq, Payload: slices.Clone(b[headerSize : headerSize+n])}, headerSize + n, true
}

func listSegments(dir string) ([]segment, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var segs []segment
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok {
			continue
		}
		first, err := strconv.ParseUint(name, 16, 64)
		if err != nil || len(name) != 16 {
			return nil, fmt.Errorf("%w: unexpected segment name %s", ErrCorrupt, e.Name())
		}
		segs = append(segs, segment{first: first, path: filepath.Join(dir, e.Name())})
	}
	slices.SortFunc(segs, func(a, b segment) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	return segs, nil
}

func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
