package testenv

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// recordingTB records how a helper ends the test: Fatalf stops it (as the
// real one does) and any Skip is recorded as such.
type recordingTB struct {
	testing.TB
	fatal, skipped string
}

type stopped struct{}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recordingTB) Skip(args ...any) { r.skipped = fmt.Sprint(args...); panic(stopped{}) }
func (r *recordingTB) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recordingTB) SkipNow() { r.skipped = "SkipNow"; panic(stopped{}) }

func findWith(t *testing.T) (path string, r *recordingTB) {
	r = &recordingTB{TB: t}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stopped); !ok {
				panic(v)
			}
		}
	}()
	return FindChromium(r), r
}

// A missing chromium fails the test with the command that installs it,
// and never skips it.
func TestFindChromiumFailsLoudlyWhenMissing(t *testing.T) {
	old := chromiumPath
	t.Cleanup(func() { chromiumPath = old })
	chromiumPath = filepath.Join(t.TempDir(), "no-chromium")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("STARLEASE_CHROMIUM", "")

	_, r := findWith(t)
	if r.skipped != "" {
		t.Fatalf("a missing chromium skipped the test: %s", r.skipped)
	}
	if !strings.Contains(r.fatal, "chromium not found at "+chromiumPath) ||
		!strings.Contains(r.fatal, "apt-get install -y --no-install-recommends chromium") ||
		!strings.Contains(r.fatal, "bash .ci/install-servers.sh") {
		t.Errorf("the failure reads %q", r.fatal)
	}

	t.Setenv("STARLEASE_CHROMIUM", chromiumPath)
	if _, r := findWith(t); r.skipped != "" || !strings.Contains(r.fatal, "STARLEASE_CHROMIUM="+chromiumPath+" cannot be run") {
		t.Errorf("a bad STARLEASE_CHROMIUM: fatal %q, skipped %q", r.fatal, r.skipped)
	}
}
