package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The AMQP URL file is checked like the pepper file, and no error shows
// the URL (it carries the broker password).
func TestLoadURLFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "amqp://relay:s3cret-pw@127.0.0.1:5672/\n", 0o600)
	if u, err := loadURLFile(good); err != nil || u != "amqp://relay:s3cret-pw@127.0.0.1:5672/" {
		t.Fatalf("good file: %q, %v", u, err)
	}
	if u, err := loadURLFile(write("ro", "amqps://relay:s3cret-pw@broker:5671/vh", 0o400)); err != nil || !strings.HasPrefix(u, "amqps://") {
		t.Fatalf("0400 file: %q, %v", u, err)
	}
	for name, p := range map[string]string{
		"group readable": write("g", "amqp://relay:s3cret-pw@127.0.0.1/\n", 0o640),
		"world readable": write("w", "amqp://relay:s3cret-pw@127.0.0.1/\n", 0o604),
		"not a URL":      write("bad", "http://relay:s3cret-pw@127.0.0.1/\n", 0o600),
		"two lines":      write("two", "amqp://relay:s3cret-pw@127.0.0.1/\namqp://x@y/\n", 0o600),
		"empty":          write("empty", "", 0o600),
		"too large":      write("large", "amqp://relay:s3cret-pw@127.0.0.1/"+strings.Repeat("a", maxURLFileBytes), 0o600),
		"missing":        filepath.Join(dir, "missing"),
		"a directory":    dir,
	} {
		_, err := loadURLFile(p)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
}

// --publish-exchanges: names separated by commas, (default) for the
// default exchange, empty for every exchange; a name no publication could
// use is refused.
func TestParsePublishExchanges(t *testing.T) {
	for in, want := range map[string][]string{
		"":                          nil,
		"  ":                        nil,
		"documents":                 {"documents"},
		"documents, results.v2":     {"documents", "results.v2"},
		"(default),documents":       {"", "documents"},
		" (default) ":               {""},
		"amq.topic,(default),x:y-z": {"amq.topic", "", "x:y-z"},
	} {
		got, err := parsePublishExchanges(in)
		if err != nil || (got == nil) != (want == nil) || strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"documents,", ",documents", "a,,b", `""`, "default)", "a b", strings.Repeat("x", 256)} {
		if got, err := parsePublishExchanges(in); err == nil {
			t.Errorf("%q accepted as %q", in, got)
		}
	}
}
