package couchdb

import (
	"regexp"
	"testing"
)

// fenceReasons lists exactly the refusals ValidateDocUpdate throws, so a
// changed text in the JavaScript cannot turn a fence refusal into an
// unrecognised one.
func TestFenceReasonsAreTheJavaScriptRefusals(t *testing.T) {
	thrown := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?:return|deny\()\s*'([^']+)'`).FindAllStringSubmatch(ValidateDocUpdate, -1) {
		thrown[m[1]] = true
	}
	if len(thrown) < 5 {
		t.Fatalf("found only %d refusals in ValidateDocUpdate: %v", len(thrown), thrown)
	}
	for r := range thrown {
		if !fenceReasons[r] {
			t.Errorf("ValidateDocUpdate throws %q, which fenceReasons does not list", r)
		}
	}
	for r := range fenceReasons {
		if !thrown[r] {
			t.Errorf("fenceReasons lists %q, which ValidateDocUpdate never throws", r)
		}
	}
}
