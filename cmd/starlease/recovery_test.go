package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/recovery"
)

type printedBackup struct {
	Code     string            `json:"code"`
	File     string            `json:"file"`
	Manifest backupfile.Header `json:"manifest"`
}

type printedVerify struct {
	Code          string          `json:"code"`
	ProofComplete bool            `json:"proof_complete"`
	Report        recovery.Report `json:"report"`
}

func TestBackupRestoreVerifyEpochPath(t *testing.T) {
	f := newFixture(t)
	stale := f.acquire(t) // held at backup time
	// A key issued before the backup travels with it (its verifier only).
	pepper := filepath.Join(t.TempDir(), "pepper")
	if err := os.WriteFile(pepper, []byte("0123456789abcdef0123456789abcdef-recovery-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var created struct {
		APIKey     string `json:"api_key"`
		Credential struct {
			CredentialID string `json:"credential_id"`
		} `json:"credential"`
	}
	runCLI(t, "keys", "create", "--data-dir", f.dir, "--pepper-file", pepper, "--principal", "prn-worker",
		"--class", "api_client", "--capabilities", "targets:lease", "--scope", "tenant:*,program:*").ok(t, &created)
	out := filepath.Join(t.TempDir(), "backup.slb")
	var b printedBackup
	runCLI(t, "backup", "--data-dir", f.dir, "--out", out).ok(t, &b)
	if raw, err := os.ReadFile(out); err != nil || bytes.Contains(raw, []byte(created.APIKey)) ||
		bytes.Contains(raw, []byte(created.APIKey[strings.LastIndex(created.APIKey, "_")+1:])) {
		t.Fatalf("the backup holds the API key or its secret (%v)", err)
	}
	if b.Code != "backed_up" || b.Manifest.Backend != "bolt" || b.Manifest.PayloadSHA256 == "" {
		t.Fatalf("backup printed %+v", b)
	}
	// Never overwritten.
	runCLI(t, "backup", "--data-dir", f.dir, "--out", out).refused(t, exitUsage, lease.CodeInvalidRequest)

	// Keep working after the backup: tokens grow.
	var p printedLease
	f.do(t, "release", held(stale)...).ok(t, &p)
	var after []uint64
	for range 3 {
		rec := f.acquire(t)
		after = append(after, rec.FencingToken)
		f.do(t, "release", held(rec)...).ok(t, &p)
	}
	maxAfter := slices.Max(after)
	if maxAfter <= stale.FencingToken {
		t.Fatalf("tokens after the backup %v", after)
	}

	// Restore the old backup into a new data dir.
	g := fixture{filepath.Join(t.TempDir(), "restored")}
	var r struct {
		Code     string            `json:"code"`
		Manifest backupfile.Header `json:"manifest"`
	}
	runCLI(t, "restore", "--in", out, "--data-dir", g.dir).ok(t, &r)
	if r.Code != "restored_unverified" || r.Manifest.PayloadSHA256 != b.Manifest.PayloadSHA256 {
		t.Fatalf("restore printed %+v", r)
	}
	var listed struct {
		Credentials []struct {
			CredentialID string `json:"credential_id"`
		} `json:"credentials"`
	}
	runCLI(t, "keys", "list", "--data-dir", g.dir).ok(t, &listed)
	if len(listed.Credentials) != 1 || listed.Credentials[0].CredentialID != created.Credential.CredentialID {
		t.Fatalf("credentials after restore: %+v", listed)
	}
	// Never over an existing store.
	runCLI(t, "restore", "--in", out, "--data-dir", g.dir).refused(t, exitUsage, lease.CodeInvalidRequest)
	runCLI(t, "restore", "--in", out, "--data-dir", f.dir).refused(t, exitUsage, lease.CodeInvalidRequest)

	// (a) the namespace refuses work until verified.
	g.do(t, "acquire").refused(t, exitBackend, lease.CodeBackendUnavailable)

	// A failing proof source leaves it closed.
	couch := testenv.StartCouchDB(t)
	if res := runCLI(t, "verify-restore", "--data-dir", g.dir, "--couchdb-url", couch.URL(), "--couchdb-db", "missing",
		"--proof-complete"); res.code == exitOK || res.stdout != "" {
		t.Fatalf("verify-restore with a missing database: %+v", res)
	}
	g.do(t, "acquire").refused(t, exitBackend, lease.CodeBackendUnavailable)
	// Usage errors change nothing either.
	runCLI(t, "verify-restore", "--data-dir", g.dir, "--proof-complete").refused(t, exitUsage, lease.CodeInvalidRequest)
	runCLI(t, "verify-restore", "--data-dir", g.dir, "--couchdb-db", "x").refused(t, exitUsage, lease.CodeInvalidRequest)
	if res := runCLI(t, "verify-restore"); res.code != exitUsage {
		t.Fatalf("verify-restore without --data-dir: %+v", res)
	}

	// No downstream proof: the epoch path.
	var v printedVerify
	res := runCLI(t, "verify-restore", "--data-dir", g.dir, "--epoch-gap", "1000")
	res.ok(t, &v)
	for _, field := range []string{`"epoch": true`, `"epoch_number": 1`, `"floor": `, `"revoked": [`} {
		if !strings.Contains(res.stdout, field) {
			t.Fatalf("verify-restore report lacks %s:\n%s", field, res.stdout)
		}
	}
	if v.Code != "recovered" || !v.Report.Epoch || v.Report.Floor != stale.FencingToken+1000 ||
		!slices.Equal(v.Report.Revoked, []string{stale.LeaseID}) {
		t.Fatalf("verify-restore printed %+v", v)
	}
	// Reopened: bolt.Open works, and a new acquire is above every token
	// issued after the backup.
	s, err := bolt.Open(filepath.Join(g.dir, storeFile), bolt.Options{ReapInterval: -1})
	if err != nil {
		t.Fatalf("bolt.Open after verification: %v", err)
	}
	s.Close()
	next := g.acquire(t)
	if next.FencingToken <= maxAfter || next.FencingToken <= v.Report.Floor || next.LeaseID == stale.LeaseID {
		t.Fatalf("new lease token %d (id %s); tokens after the backup %v, floor %d", next.FencingToken, next.LeaseID, after, v.Report.Floor)
	}
	// The stale holder from before the restore cannot act.
	g.do(t, "renew", held(stale)...).refused(t, exitRefused, lease.CodeLost)
	// Verification runs once.
	if res := runCLI(t, "verify-restore", "--data-dir", g.dir); res.code == exitOK {
		t.Fatalf("second verify-restore succeeded: %s", res.stdout)
	}
}
