// Package backupfile is the versioned, checksummed container of a starlease
// backup, shared by every backend:
//
//	starlease-backup\n
//	{header JSON}\n
//	payload (header.payload_bytes bytes, SHA-256 = header.payload_sha256)
//
// Reading is strict: a wrong magic, an unknown version, a malformed header,
// a short or long payload or a checksum mismatch is a typed error, and the
// caller must discard whatever payload it received.
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
}

// Typed read errors; match with errors.Is.
var (
	ErrMagic     = errors.New("backup: not a starlease backup (bad magic)")
	ErrVersion   = errors.New("backup: unsupported backup version")
	ErrHeader    = errors.New("backup: malformed header")
	ErrTruncated = errors.New("backup: payload length does not match the header")
	ErrChecksum  = errors.New("backup: payload checksum mismatch")
)

// Write writes the container. payload is called twice with a writer: first
// to measure and hash, then to emit; it must produce identical bytes both
// times (a bbolt read transaction's WriteTo does).
func Write(w io.Writer, h Header, payload func(io.Writer) error) (Header, error) {
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
	return h, bw.Flush()
}

// Read strictly reads a container, copying the payload to dst (which the
// caller must discard on any error). Trailing bytes after the payload are an
// error.
func Read(r io.Reader, dst io.Writer) (Header, error) {
	br := bufio.NewReader(r)
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
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, sum), io.LimitReader(br, h.PayloadBytes))
	if err != nil {
		return Header{}, err
	}
	if n != h.PayloadBytes {
		return Header{}, ErrTruncated
	}
	if extra, _ := br.Read(make([]byte, 1)); extra != 0 {
		return Header{}, ErrTruncated
	}
	if hex.EncodeToString(sum.Sum(nil)) != h.PayloadSHA256 {
		return Header{}, ErrChecksum
	}
	return h, nil
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
