package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// ChromiumBinary is Debian's chromium browser itself. The package's
// /usr/bin/chromium is a wrapper script that sources /etc/chromium.d (which
// turns on remote extensions and loads every extension installed with
// Debian) before it runs this binary; the tests run the binary directly so
// that the flags they give are the browser's whole configuration.
const ChromiumBinary = "/usr/lib/chromium/chromium"

// ChromiumInstallHint is the command that installs the browser.
const ChromiumInstallHint = "bash .ci/install-servers.sh (or: apt-get install -y --no-install-recommends chromium)"

// chromiumPath is where FindChromium looks first (tests change it).
var chromiumPath = ChromiumBinary

// FindChromium returns the chromium binary the browser tests drive:
// $STARLEASE_CHROMIUM if set, else Debian's ChromiumBinary, else chromium
// on PATH. A missing browser fails t with the command that installs it;
// it is never a skip.
func FindChromium(t testing.TB) string {
	t.Helper()
	p, err := findChromium()
	if err != nil {
		// Never a skip: a run without the browser must fail loudly,
		// inside CI (CI=true) and out.
		t.Fatalf("testenv: %v (CI=%q); install it with: %s", err, os.Getenv("CI"), ChromiumInstallHint)
	}
	return p
}

func findChromium() (string, error) {
	if p := os.Getenv("STARLEASE_CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("STARLEASE_CHROMIUM=%s cannot be run: %v", p, err)
		}
		return p, nil
	}
	if _, err := exec.LookPath(chromiumPath); err == nil {
		return chromiumPath, nil
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("chromium not found at %s or on PATH", chromiumPath)
}
