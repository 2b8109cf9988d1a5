package race

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// This file writes what a failed run leaves behind (etcd's
// tests/robustness/report): porcupine's HTML visualization of the history
// and its partial linearizations, and the history as JSON.

// reportDir returns dir, or a new directory under os.TempDir() that
// survives the test.
func reportDir(dir string) (string, error) {
	if dir != "" {
		return dir, os.MkdirAll(dir, 0o755)
	}
	return os.MkdirTemp("", "starlease-race-")
}

// writeReport writes the visualization and the history and returns the
// visualization's path.
func writeReport(dir string, model porcupine.Model, info porcupine.LinearizationInfo, h *History, annotations []porcupine.Annotation) (string, error) {
	dir, err := reportDir(dir)
	if err != nil {
		return "", err
	}
	info.AddAnnotations(annotations)
	html := filepath.Join(dir, "linearizability.html")
	if err := porcupine.VisualizePath(model, info, html); err != nil {
		return "", err
	}
	if h != nil {
		b, err := json.MarshalIndent(h, "", " ")
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "history.json"), b, 0o644)
		}
		if err != nil {
			return html, err
		}
	}
	return html, nil
}

// explain says why a partition has no linearization: it replays the
// longest partial linearization porcupine found (ids index ops) through the
// model and asks the model why each operation that could come next cannot.
func explain(base int64, ops []porcupine.Operation, partial []int) string {
	s := State{}
	in := make(map[int]bool, len(partial))
	for _, id := range partial {
		op := ops[id]
		next, err := Step(s, op.Input.(Input), op.Output.(Output))
		if err != nil {
			return fmt.Sprintf("replaying the partial linearization failed: %v", err)
		}
		s = next
		in[id] = true
	}
	var rest []porcupine.Operation
	for id, op := range ops {
		if !in[id] {
			rest = append(rest, op)
		}
	}
	if len(rest) == 0 {
		return "every operation linearized"
	}
	// Only operations called before the earliest remaining return can be
	// next in real-time order.
	minRet := slices.MinFunc(rest, func(a, b porcupine.Operation) int { return cmpInt(a.Return, b.Return) }).Return
	var b strings.Builder
	fmt.Fprintf(&b, "after %d operations (state: %s), no remaining operation can be next:", len(partial), describeState(base, s))
	n := 0
	for _, op := range rest {
		if op.Call > minRet {
			continue
		}
		if n == 6 {
			b.WriteString("\n    …")
			break
		}
		n++
		i, o := op.Input.(Input), op.Output.(Output)
		_, err := Step(s, i, o)
		why := "would leave a later operation impossible"
		if err != nil {
			why = err.Error()
		}
		fmt.Fprintf(&b, "\n    worker %d: %s: %s", op.ClientId, describeOp(base, i, o), why)
	}
	return b.String()
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
