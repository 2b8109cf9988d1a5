package backupfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

var created = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// golden is a file without sections exactly as the container was written
// before sections existed.
const golden = "starlease-backup\n" +
	`{"magic":"starlease-backup","version":1,"backend":"bolt","created_at":"2024-01-02T03:04:05Z",` +
	`"payload_sha256":"239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5","payload_bytes":7,` +
	`"counts":{"counters":2}}` + "\npayload"

func payload(s string) func(io.Writer) error {
	return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
}

func write(t *testing.T, p string, sections ...SectionData) ([]byte, Header) {
	t.Helper()
	var b bytes.Buffer
	h, err := Write(&b, Header{Backend: "bolt", CreatedAt: created, Counts: map[string]int64{"counters": 2}}, payload(p), sections...)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return b.Bytes(), h
}

func sum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// raw builds a file from an arbitrary header value, for headers Write
// refuses to produce.
func raw(t *testing.T, h any, body string) []byte {
	t.Helper()
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(Magic + "\n" + string(hb) + "\n" + body)
}

func header(sections ...Section) Header {
	return Header{Magic: Magic, Version: Version, Backend: "bolt", CreatedAt: created,
		PayloadSHA256: sum("payload"), PayloadBytes: 7, Sections: sections}
}

func TestWithoutSectionsByteIdentical(t *testing.T) {
	b, h := write(t, "payload")
	if string(b) != golden {
		t.Fatalf("file without sections changed:\n%s\nwant\n%s", b, golden)
	}
	if h.Sections != nil {
		t.Fatalf("Sections = %v, want none", h.Sections)
	}
	var got bytes.Buffer
	rh, err := Read(strings.NewReader(golden), &got)
	if err != nil || got.String() != "payload" || rh.PayloadBytes != 7 || rh.Counts["counters"] != 2 || rh.Sections != nil {
		t.Fatalf("Read = %+v %q %v", rh, got.String(), err)
	}
	got.Reset()
	_, secs, err := ReadAll(strings.NewReader(golden), &got)
	if err != nil || got.String() != "payload" || len(secs) != 0 {
		t.Fatalf("ReadAll = %v %q %v", secs, got.String(), err)
	}
}

func TestSectionsRoundTrip(t *testing.T) {
	b, h := write(t, "payload", SectionData{Name: "credentials", Data: []byte("line1\nline2\n")},
		SectionData{Name: "empty_0", Data: nil})
	want := []Section{{Name: "credentials", Bytes: 12, SHA256: sum("line1\nline2\n")}, {Name: "empty_0", Bytes: 0, SHA256: sum("")}}
	if len(h.Sections) != 2 || h.Sections[0] != want[0] || h.Sections[1] != want[1] {
		t.Fatalf("Sections = %+v, want %+v", h.Sections, want)
	}
	if !bytes.HasSuffix(b, []byte("\npayloadline1\nline2\n")) {
		t.Fatalf("sections do not follow the payload: %q", b)
	}
	var got bytes.Buffer
	rh, secs, err := ReadAll(bytes.NewReader(b), &got)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "payload" || len(secs) != 2 || string(secs["credentials"]) != "line1\nline2\n" || len(secs["empty_0"]) != 0 {
		t.Fatalf("ReadAll = %q %q", got.String(), secs)
	}
	if _, ok := secs["empty_0"]; !ok {
		t.Fatal("an empty section is missing from the map")
	}
	if len(rh.Sections) != 2 || rh.Sections[0] != want[0] || rh.Sections[1] != want[1] {
		t.Fatalf("read Sections = %+v", rh.Sections)
	}
	// Read still verifies the sections and returns the same header.
	got.Reset()
	if rh2, err := Read(bytes.NewReader(b), &got); err != nil || got.String() != "payload" || len(rh2.Sections) != 2 {
		t.Fatalf("Read = %+v %v", rh2, err)
	}
}

func TestSectionDamage(t *testing.T) {
	b, _ := write(t, "payload", SectionData{Name: "a", Data: []byte("first")}, SectionData{Name: "b", Data: []byte("second")})
	cases := map[string]struct {
		mod  func([]byte) []byte
		want error
	}{
		"flipped last section byte":  {func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, ErrChecksum},
		"flipped first section byte": {func(b []byte) []byte { b[len(b)-len("firstsecond")] ^= 1; return b }, ErrChecksum},
		"flipped payload byte":       {func(b []byte) []byte { b[len(b)-len("payloadfirstsecond")] ^= 1; return b }, ErrChecksum},
		"last section cut short":     {func(b []byte) []byte { return b[:len(b)-1] }, ErrTruncated},
		"last section missing":       {func(b []byte) []byte { return b[:len(b)-len("second")] }, ErrTruncated},
		"every section missing":      {func(b []byte) []byte { return b[:len(b)-len("firstsecond")] }, ErrTruncated},
		"payload byte deleted": {func(b []byte) []byte {
			i := len(b) - len("payloadfirstsecond")
			return append(b[:i:i], b[i+1:]...)
		}, ErrTruncated},
		"trailing byte": {func(b []byte) []byte { return append(b, 'x') }, ErrTruncated},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			bad := c.mod(bytes.Clone(b))
			if _, err := Read(bytes.NewReader(bad), io.Discard); !errors.Is(err, c.want) {
				t.Fatalf("Read = %v, want %v", err, c.want)
			}
			if _, secs, err := ReadAll(bytes.NewReader(bad), io.Discard); !errors.Is(err, c.want) || secs != nil {
				t.Fatalf("ReadAll = %v %v, want %v and no sections", secs, err, c.want)
			}
		})
	}
}

func TestSectionNamesRefusedOnWrite(t *testing.T) {
	for name, secs := range map[string][]SectionData{
		"empty":     {{Name: ""}},
		"upper":     {{Name: "Credentials"}},
		"dash":      {{Name: "a-b"}},
		"space":     {{Name: "a b"}},
		"non-ascii": {{Name: "é"}},
		"too long":  {{Name: strings.Repeat("a", maxSectionName+1)}},
		"duplicate": {{Name: "a", Data: []byte("1")}, {Name: "a", Data: []byte("2")}},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if _, err := Write(&b, Header{Backend: "bolt"}, payload("payload"), secs...); !errors.Is(err, ErrHeader) {
				t.Fatalf("Write = %v, want ErrHeader", err)
			}
			if b.Len() != 0 {
				t.Fatalf("a refused Write wrote %d bytes", b.Len())
			}
		})
	}
	var b bytes.Buffer
	if _, err := Write(&b, Header{Backend: "bolt"}, payload(""), SectionData{Name: strings.Repeat("z", maxSectionName)}); err != nil {
		t.Fatalf("longest name refused: %v", err)
	}
}

func TestSectionHeaderRefusedOnRead(t *testing.T) {
	ok := Section{Name: "a", Bytes: 1, SHA256: sum("x")}
	for name, c := range map[string]struct {
		h    any
		body string
	}{
		"duplicate":     {header(ok, ok), "payloadxx"},
		"empty name":    {header(Section{Name: "", Bytes: 1, SHA256: sum("x")}), "payloadx"},
		"invalid name":  {header(Section{Name: "A", Bytes: 1, SHA256: sum("x")}), "payloadx"},
		"negative size": {header(Section{Name: "a", Bytes: -1, SHA256: sum("x")}), "payload"},
		"short sha256":  {header(Section{Name: "a", Bytes: 1, SHA256: "00"}), "payloadx"},
		"unknown field": {map[string]any{"magic": Magic, "version": 1, "backend": "bolt", "created_at": created,
			"payload_sha256": sum("payload"), "payload_bytes": 7,
			"sections": []map[string]any{{"name": "a", "bytes": 1, "sha256": sum("x"), "extra": 1}}}, "payloadx"},
	} {
		t.Run(name, func(t *testing.T) {
			f := raw(t, c.h, c.body)
			if _, err := Read(bytes.NewReader(f), io.Discard); !errors.Is(err, ErrHeader) {
				t.Fatalf("Read = %v, want ErrHeader", err)
			}
			if _, _, err := ReadAll(bytes.NewReader(f), io.Discard); !errors.Is(err, ErrHeader) {
				t.Fatalf("ReadAll = %v, want ErrHeader", err)
			}
		})
	}
	// The same header with a valid section reads, so the cases above fail
	// for the reason they name.
	if _, secs, err := ReadAll(bytes.NewReader(raw(t, header(ok), "payloadx")), io.Discard); err != nil || string(secs["a"]) != "x" {
		t.Fatalf("valid hand-made file: %q %v", secs, err)
	}
}

// A header that claims a huge section does not make the reader allocate it.
func TestSectionClaimNotTrusted(t *testing.T) {
	f := raw(t, header(Section{Name: "a", Bytes: 1 << 50, SHA256: sum("x")}), "payloadx")
	if _, _, err := ReadAll(bytes.NewReader(f), io.Discard); !errors.Is(err, ErrTruncated) {
		t.Fatalf("ReadAll = %v, want ErrTruncated", err)
	}
}

// A backend's own refusal keeps its words and matches ErrRestoreTarget,
// itself and nothing else.
func TestTargetError(t *testing.T) {
	own := TargetError("target holds a namespace")
	err := fmt.Errorf("%w: /some/path", own)
	if !errors.Is(err, ErrRestoreTarget) || !errors.Is(err, own) || errors.Is(err, TargetError("another")) || errors.Is(err, ErrChecksum) {
		t.Fatalf("%v matches wrongly", err)
	}
	if err.Error() != "target holds a namespace: /some/path" {
		t.Fatalf("message %q", err.Error())
	}
}

// A backup of another backend is refused with ErrBackend.
func TestCheckBackend(t *testing.T) {
	h := Header{Backend: "bolt"}
	if err := CheckBackend(h, "bolt"); err != nil {
		t.Fatal(err)
	}
	if err := CheckBackend(h, "etcd"); !errors.Is(err, ErrBackend) || !strings.Contains(err.Error(), `"bolt"`) {
		t.Fatalf("another backend's backup: %v", err)
	}
}
