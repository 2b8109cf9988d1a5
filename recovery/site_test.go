package recovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/lease"
)

// boltSite is a bolt data directory as the recovery commands lay it out.
func boltSite(dir string) *Site {
	return &Site{Backend: bolt.NewNamespace(filepath.Join(dir, "store.db"), bolt.Options{}), Field: "data_dir", Dir: dir,
		Credentials: filepath.Join(dir, "credentials"), AuditFile: filepath.Join(dir, "audit.db")}
}

// A bolt site's backup, restore and verification, each one call: the
// credentials beside the store travel with it, every step is audited in
// the site's audit file, and the refusals name the site's field.
func TestBoltSite(t *testing.T) {
	ctx := context.Background()
	src := boltSite(filepath.Join(t.TempDir(), "src"))
	out := filepath.Join(t.TempDir(), "backup.slb")
	if _, err := src.Backup(ctx, out); lease.AsError(err).Field != "data_dir" {
		t.Fatalf("backup of a directory without a store: %v", err)
	}
	for _, p := range []string{out, src.Dir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("a refused backup left %s: %v", p, err)
		}
	}
	if err := os.MkdirAll(src.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	live := open(t, filepath.Join(src.Dir, "store.db"))
	held := underLease(t, live, "target-1", "req-1", true, func(*lease.Record, *fence.Committer) {})
	live.Close() // bbolt admits one opener per file
	creds, err := auth.OpenFileStore(src.Credentials)
	if err != nil {
		t.Fatal(err)
	}
	_, issued := issueKey(t, creds, nil)
	creds.Close()
	m, err := src.Backup(ctx, out)
	if err != nil || m.Backend != "bolt" || len(m.Sections) != 1 || m.Sections[0].Name != CredentialsSection {
		t.Fatalf("backup: %+v %v", m, err)
	}
	if _, err := src.Backup(ctx, out); lease.AsError(err).Field != "out" {
		t.Fatalf("backup over an existing file: %v", err)
	}
	if _, err := src.Restore(ctx, out); lease.AsError(err).Field != "data_dir" {
		t.Fatalf("restore over a live store: %v", err)
	}
	if _, err := src.Seal(ctx); lease.AsError(err).Field != "backend" {
		t.Fatalf("seal of a bolt store: %v", err)
	}

	dst := boltSite(filepath.Join(t.TempDir(), "dst"))
	if r, err := dst.Restore(ctx, out); err != nil || r.PayloadSHA256 != m.PayloadSHA256 {
		t.Fatalf("restore: %+v %v", r, err)
	}
	restored, err := auth.OpenFileStore(dst.Credentials)
	if err != nil {
		t.Fatal(err)
	}
	got, err := restored.List(ctx, "", 10)
	restored.Close()
	if err != nil || len(got) != 1 || got[0].ID != issued.ID {
		t.Fatalf("restored credentials %+v %v", got, err)
	}
	mustBeClosed(t, filepath.Join(dst.Dir, "store.db"))
	rep, proof, err := dst.Verify(ctx, Sources{}, Options{EpochGap: 10})
	if err != nil || !rep.Epoch || proof.Complete || !slices.Equal(rep.Revoked, []string{held.LeaseID}) {
		t.Fatalf("verify: %+v %+v %v", rep, proof, err)
	}
	sink, err := bolt.OpenAudit(dst.AuditFile, bolt.AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	events, err := sink.Read(ctx, audit.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []audit.EventType
	for _, e := range events {
		types = append(types, e.EventType)
	}
	if !slices.Equal(types, []audit.EventType{audit.EventRecoveryRestore, audit.EventRecoveryVerify,
		audit.EventRecoveryRevoke, audit.EventRecoveryReopen}) {
		t.Fatalf("audit of the restored site: %v", types)
	}
}
