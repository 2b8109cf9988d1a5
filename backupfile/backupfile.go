// Package backupfile is the versioned, checksummed container of a starlease
// backup, shared by every backend:
//
//	starlease-backup\n
//	{header JSON}\n
//	payload (header.payload_bytes bytes, SHA-256 = header.payload_sha256)
//	section 1 … section n (header.sections[i].bytes bytes each, in order)
//
// Sections are optional named parts after the payload (the bolt backend
// carries its credential store in one). A file without sections has no
// "sections" key, so it is byte-identical to one written before sections
// existed, and Version stays 1: a build that predates sections refuses a
// file with them as a malformed header (unknown field), never silently.
//
// Reading is strict: a wrong magic, an unknown version, a malformed header
// (including a section name that is empty, not [a-z0-9_]+ or repeated), a
// short or long payload or section, trailing bytes or a checksum mismatch is
// a typed error, and the caller must discard whatever payload it received.
package backupfile

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Magic opens every backup file.
const Magic = "starlease-backup"

// Version is the only container version this build reads and writes.
const Version = 1

// maxHeader bounds the header line.
const maxHeader = 64 << 10

// Header describes a backup. It is the manifest returned by Backup.
type Header struct {
	Magic         string           `json:"magic"`
	Version       int              `json:"version"`
	Backend       string           `json:"backend"`
	CreatedAt     time.Time        `json:"created_at"`
	PayloadSHA256 string           `json:"payload_sha256"`
	PayloadBytes  int64            `json:"payload_bytes"`
	Counts        map[string]int64 `json:"counts,omitempty"`
	// Sections lists the parts after the payload, in file order.
	Sections []Section `json:"sections,omitempty"`
}

// Section describes one named part after the payload.
type Section struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// SectionData is a section to write.
type SectionData struct {
	Name string
	Data []byte
}

// maxSectionName bounds a section name.
const maxSectionName = 64

// Typed read errors; match with errors.Is.
var (
	ErrMagic     = errors.New("backup: not a starlease backup (bad magic)")
	ErrVersion   = errors.New("backup: unsupported backup version")
	ErrHeader    = errors.New("backup: malformed header")
	ErrTruncated = errors.New("backup: payload length does not match the header")
	ErrChecksum  = errors.New("backup: payload checksum mismatch")
)

// ErrBackend is matched (errors.Is) by the refusal of a backup written by
// another backend than the one restoring it.
var ErrBackend = errors.New("backup: written by another backend")

// CheckBackend refuses, with an error matching ErrBackend, a backup whose
// header names another backend than name.
func CheckBackend(h Header, name string) error {
	if h.Backend != name {
		return fmt.Errorf("%w: backup is of backend %q, not %q", ErrBackend, h.Backend, name)
	}
	return nil
}

// ErrRestoreTarget is matched (errors.Is) by every backend's refusal to
// restore into a target that is not empty, so a caller driving any backend
// (package recovery) can tell that refusal from a bad backup. A restore
// never replaces or merges into a namespace: that could roll its counters
// back.
var ErrRestoreTarget = errors.New("backup: restore target is not empty")

// TargetError is a backend's own refusal of a restore target, in its own
// words; it matches ErrRestoreTarget.
type TargetError string

func (e TargetError) Error() string { return string(e) }

// Is reports whether target is ErrRestoreTarget.
func (e TargetError) Is(target error) bool { return target == ErrRestoreTarget }

// Write writes the container. payload is called twice with a writer: first
// to measure and hash, then to emit; it must produce identical bytes both
// times (a bbolt read transaction's WriteTo does). The sections follow the
// payload in the order given; their names must be unique and [a-z0-9_]+
// (an error wrapping ErrHeader otherwise). Any h.Sections is replaced.
func Write(w io.Writer, h Header, payload func(io.Writer) error, sections ...SectionData) (Header, error) {
	h.Sections = nil
	for _, s := range sections {
		sum := sha256.Sum256(s.Data)
		h.Sections = append(h.Sections, Section{Name: s.Name, Bytes: int64(len(s.Data)), SHA256: hex.EncodeToString(sum[:])})
	}
	if err := checkSections(h.Sections); err != nil {
		return Header{}, err
	}
	sum := sha256.New()
	cw := &countWriter{w: sum}
	if err := payload(cw); err != nil {
		return Header{}, err
	}
	h.Magic, h.Version = Magic, Version
	h.PayloadSHA256, h.PayloadBytes = hex.EncodeToString(sum.Sum(nil)), cw.n
	hb, err := json.Marshal(h)
	if err != nil {
		return Header{}, err
	}
	bw := bufio.NewWriter(w)
	bw.WriteString(Magic + "\n")
	bw.Write(hb)
	bw.WriteByte('\n')
	check := sha256.New()
	cw2 := &countWriter{w: io.MultiWriter(bw, check)}
	if err := payload(cw2); err != nil {
		return Header{}, err
	}
	if cw2.n != h.PayloadBytes || hex.EncodeToString(check.Sum(nil)) != h.PayloadSHA256 {
		return Header{}, errors.New("backup: payload changed between passes")
	}
	for _, s := range sections {
		bw.Write(s.Data) // a write error is sticky and reported by Flush
	}
	return h, bw.Flush()
}

// Read strictly reads a container, copying the payload to dst (which the
// caller must discard on any error). Every section is verified too (and
// discarded); trailing bytes after the last part are an error.
func Read(r io.Reader, dst io.Writer) (Header, error) {
	h, _, err := read(r, dst, false)
	return h, err
}

// ReadAll is Read that also returns every section's bytes by name. The
// sections are returned only when the whole file verifies.
func ReadAll(r io.Reader, dst io.Writer) (Header, map[string][]byte, error) {
	return read(r, dst, true)
}

// read verifies the whole file. Length errors (ErrTruncated) are reported
// before checksum errors, so a missing or extra byte anywhere reads as a
// truncation, as it did before sections existed.
func read(r io.Reader, dst io.Writer, keep bool) (Header, map[string][]byte, error) {
	br := bufio.NewReader(r)
	h, err := readHeader(br)
	if err != nil {
		return Header{}, nil, err
	}
	payloadSum, err := readPart(br, dst, h.PayloadBytes)
	if err != nil {
		return Header{}, nil, err
	}
	var data map[string][]byte
	if keep {
		data = make(map[string][]byte, len(h.Sections))
	}
	sums := make([]string, len(h.Sections))
	for i, s := range h.Sections {
		// The buffer grows with the bytes actually read, never with the
		// header's claim.
		var buf bytes.Buffer
		w := io.Discard
		if keep {
			w = &buf
		}
		if sums[i], err = readPart(br, w, s.Bytes); err != nil {
			return Header{}, nil, fmt.Errorf("%w (section %q)", err, s.Name)
		}
		if keep {
			data[s.Name] = buf.Bytes()
		}
	}
	if extra, _ := br.Read(make([]byte, 1)); extra != 0 {
		return Header{}, nil, ErrTruncated
	}
	if payloadSum != h.PayloadSHA256 {
		return Header{}, nil, ErrChecksum
	}
	for i, s := range h.Sections {
		if sums[i] != s.SHA256 {
			return Header{}, nil, fmt.Errorf("%w (section %q)", ErrChecksum, s.Name)
		}
	}
	return h, data, nil
}

func readHeader(br *bufio.Reader) (Header, error) {
	magic, err := readLine(br, len(Magic)+1)
	if err != nil || magic != Magic {
		return Header{}, ErrMagic
	}
	line, err := readLine(br, maxHeader)
	if err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrHeader, err)
	}
	var h Header
	dec := json.NewDecoder(bytes.NewReader([]byte(line)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrHeader, err)
	}
	if h.Magic != Magic {
		return Header{}, ErrMagic
	}
	if h.Version != Version {
		return Header{}, fmt.Errorf("%w: %d", ErrVersion, h.Version)
	}
	if h.Backend == "" || h.PayloadBytes < 0 || len(h.PayloadSHA256) != 64 {
		return Header{}, ErrHeader
	}
	if err := checkSections(h.Sections); err != nil {
		return Header{}, err
	}
	return h, nil
}

// readPart copies the next n bytes to w and returns their hex SHA-256, or
// ErrTruncated when the file ends first.
func readPart(br *bufio.Reader, w io.Writer, n int64) (string, error) {
	sum := sha256.New()
	got, err := io.Copy(io.MultiWriter(w, sum), io.LimitReader(br, n))
	if err != nil {
		return "", err
	}
	if got != n {
		return "", ErrTruncated
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}

// checkSections enforces the section rules shared by Write and Read, so a
// file this package writes is always one it reads.
func checkSections(ss []Section) error {
	seen := make(map[string]bool, len(ss))
	for _, s := range ss {
		if !validSectionName(s.Name) {
			// The name is not echoed: on read it is untrusted and may be long.
			return fmt.Errorf("%w: a section name is not 1-%d of [a-z0-9_]", ErrHeader, maxSectionName)
		}
		if seen[s.Name] {
			return fmt.Errorf("%w: section %q appears twice", ErrHeader, s.Name)
		}
		seen[s.Name] = true
		if s.Bytes < 0 || len(s.SHA256) != 64 {
			return fmt.Errorf("%w: section %q", ErrHeader, s.Name)
		}
	}
	return nil
}

func validSectionName(name string) bool {
	if name == "" || len(name) > maxSectionName {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

func readLine(br *bufio.Reader, limit int) (string, error) {
	var b []byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		if len(b) >= limit {
			return "", errors.New("line too long")
		}
		b = append(b, c)
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
