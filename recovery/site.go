package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/starintel/starlease/audit"
	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/backupfile"
	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

// Site is one deployment's namespace as the recovery commands reach it:
// a Backend and what its servers keep beside it (a bolt data directory's
// credentials and audit file). Backup, Restore, Seal and Verify each do a
// whole command: they write its recovery audit steps, and close what they
// opened, the Backend included.
type Site struct {
	// Backend is the namespace.
	Backend Backend
	// Field names the option that chose the namespace ("data_dir"), in
	// errors about it as a target.
	Field string
	// Dir, if set, is the directory of the site's files, created (0700)
	// before a restore writes into it and before the audit file opens.
	Dir string
	// Credentials, if set, is the directory of a credential store
	// (auth.FileStore) kept outside the namespace: a backup carries it as
	// CredentialsSection, and a restore recreates it into an empty
	// directory. Empty when the namespace holds its credentials itself.
	Credentials string
	// AuditFile, if set, is the audit file (bolt.OpenAudit) the steps are
	// written to; otherwise the Backend must be an Auditor.
	AuditFile string
	// Logger receives the steps as log records too; nil means
	// slog.Default(). Either way secret-shaped values are screened
	// (audit.ScreenLogger).
	Logger *slog.Logger
}

func (s *Site) log() *slog.Logger { return audit.ScreenLogger(s.Logger, nil) }

// auditSink opens where the site's servers write audit.
func (s *Site) auditSink(ctx context.Context) (audit.Sink, error) {
	if s.AuditFile == "" {
		a, ok := s.Backend.(Auditor)
		if !ok {
			// Never only a log: the steps are durable audit events.
			return nil, lease.Errorf(lease.CodeBackendUnavailable, "the %s backend has no audit stream; name an audit file", s.Backend.Name())
		}
		return a.AuditSink(ctx)
	}
	if err := s.mkdir(); err != nil {
		return nil, err
	}
	return bolt.OpenAudit(s.AuditFile, bolt.AuditOptions{})
}

func (s *Site) mkdir() error {
	if s.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "cannot create the data directory")
	}
	return nil
}

// Backup writes one consistent snapshot of the namespace to the file out,
// which it creates (never overwriting one) and removes again on any
// failure, and audits it.
func (s *Site) Backup(ctx context.Context, out string) (backupfile.Header, error) {
	defer s.Backend.Close()
	log := s.log()
	if err := s.Backend.Open(ctx); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return backupfile.Header{}, lease.Invalid(s.Field, "holds no store file")
		}
		return backupfile.Header{}, err
	}
	var sections []backupfile.SectionData
	if s.Credentials != "" {
		// The credentials live beside the store: they travel as a section
		// (verifiers only; the pepper never enters a backup).
		creds, err := auth.OpenFileStore(s.Credentials)
		if err != nil {
			return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot open the credentials")
		}
		defer creds.Close()
		data, n, err := BackupCredentials(ctx, creds)
		if err != nil {
			return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot read the credentials: %v", err)
		}
		log.Info("credentials carried by the backup", "credentials", n)
		sections = append(sections, backupfile.SectionData{Name: CredentialsSection, Data: data})
	}
	sink, err := s.auditSink(ctx)
	if err != nil {
		return backupfile.Header{}, err
	}
	defer sink.Close()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return backupfile.Header{}, lease.Invalid("out", "cannot create the backup file (it must not exist)")
	}
	m, err := s.Backend.Backup(ctx, f, sections...)
	if err == nil {
		if err = f.Sync(); err != nil {
			err = lease.Errorf(lease.CodeBackendUnavailable, "cannot sync the backup file")
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = lease.Errorf(lease.CodeBackendUnavailable, "cannot close the backup file")
	}
	if err != nil {
		os.Remove(out)
		Step(ctx, sink, log, audit.EventRecoveryBackup, false, "backup failed ("+string(lease.CodeOf(err))+")")
		return backupfile.Header{}, err
	}
	if err := Step(ctx, sink, log, audit.EventRecoveryBackup, true, fmt.Sprintf("%s backup %s taken: %d payload bytes, counts %v",
		m.Backend, ShortSHA(m.PayloadSHA256), m.PayloadBytes, m.Counts)); err != nil {
		os.Remove(out)
		return backupfile.Header{}, err
	}
	return m, nil
}

// Restore verifies the backup file in, then restores it (and the
// credentials it carries, if the site keeps them outside the namespace)
// into the empty namespace, which stays closed until Verify, and audits
// it. A backup that fails verification, or a target that is not empty,
// restores nothing.
func (s *Site) Restore(ctx context.Context, in string) (backupfile.Header, error) {
	defer s.Backend.Close()
	f, err := os.Open(in)
	if err != nil {
		return backupfile.Header{}, lease.Invalid("in", "cannot open the backup file")
	}
	defer f.Close()
	m, sections, err := backupfile.ReadAll(f, io.Discard)
	if err != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeCorrupt, "backup file rejected: %v", err)
	}
	if name := s.Backend.Name(); m.Backend != name {
		return backupfile.Header{}, lease.Invalid("in", fmt.Sprintf("the backup is of backend %s, not %s", m.Backend, name))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot reread the backup file")
	}
	log := s.log()
	if err := s.mkdir(); err != nil {
		return backupfile.Header{}, err
	}
	if s.Credentials != "" {
		// Checked before the store is written, so a refusal leaves nothing.
		if held, err := os.ReadDir(s.Credentials); err == nil && len(held) > 0 {
			return backupfile.Header{}, lease.Invalid(s.Field, "its credentials directory is not empty")
		}
	}
	if _, err := s.Backend.Restore(ctx, f); err != nil {
		var le *lease.Error
		switch {
		case errors.Is(err, backupfile.ErrRestoreTarget):
			return backupfile.Header{}, lease.Invalid(s.Field, err.Error())
		case errors.As(err, &le):
			return backupfile.Header{}, err
		}
		return backupfile.Header{}, lease.Errorf(lease.CodeCorrupt, "restore failed: %v", err)
	}
	if data, ok := sections[CredentialsSection]; ok && s.Credentials != "" {
		creds, err := auth.OpenFileStore(s.Credentials)
		if err != nil {
			return backupfile.Header{}, lease.Errorf(lease.CodeBackendUnavailable, "cannot create the credentials directory")
		}
		n, err := RestoreCredentials(ctx, creds, data)
		creds.Close()
		if err != nil {
			return backupfile.Header{}, lease.Errorf(lease.CodeCorrupt, "credentials not restored: %v", err)
		}
		log.Info("credentials restored", "credentials", n)
	}
	sink, err := s.auditSink(ctx)
	if err != nil {
		return backupfile.Header{}, err
	}
	defer sink.Close()
	if err := Step(ctx, sink, log, audit.EventRecoveryRestore, true, fmt.Sprintf(
		"%s backup %s of %s restored; namespace closed until verify-restore", m.Backend, ShortSHA(m.PayloadSHA256),
		m.CreatedAt.Format(time.RFC3339))); err != nil {
		return backupfile.Header{}, err
	}
	return m, nil
}

// Seal closes the namespace after a failover (its Backend must be a
// Sealer), so it stays closed until Verify, and audits it. It reports
// whether it closed the namespace: one already closed for recovery is left
// as it is.
func (s *Site) Seal(ctx context.Context) (bool, error) {
	defer s.Backend.Close()
	sealer, ok := s.Backend.(Sealer)
	if !ok {
		return false, lease.Invalid("backend", "seal closes a Valkey namespace after a failover; a "+s.Backend.Name()+" store is restored instead")
	}
	sealed, err := sealer.Seal(ctx)
	if err != nil {
		return false, err
	}
	reason := "namespace sealed after a failover; closed until verify-restore"
	if !sealed {
		reason = "seal found the namespace already closed for recovery; unchanged"
	}
	sink, err := s.auditSink(ctx)
	if err != nil {
		return false, err
	}
	defer sink.Close()
	if err := Step(ctx, sink, s.log(), audit.EventRecoveryRestore, true, reason); err != nil {
		return false, err
	}
	return sealed, nil
}

// Verify reads the downstream proof from src and runs Verify (the
// function) on the closed namespace, with o's Audit and Logger replaced by
// the site's. A proof that cannot be read leaves the namespace closed, and
// is audited too. The proof is returned for the caller's report.
func (s *Site) Verify(ctx context.Context, src Sources, o Options) (Report, Proof, error) {
	defer s.Backend.Close()
	log := s.log()
	ns, err := s.Backend.OpenClosed(ctx)
	if err != nil {
		var le *lease.Error
		if !errors.As(err, &le) {
			// The namespace is open: the operator's to restore or seal.
			return Report{}, Proof{}, lease.Invalid("backend", err.Error())
		}
		return Report{}, Proof{}, err
	}
	sink, err := s.auditSink(ctx)
	if err != nil {
		ns.Close()
		return Report{}, Proof{}, err
	}
	defer sink.Close()
	proof, err := src.Proof(ctx)
	if err != nil {
		ns.Close()
		Step(ctx, sink, log, audit.EventRecoveryReopen, false,
			"downstream proof failed ("+string(lease.CodeOf(err))+"); namespace stays closed")
		return Report{}, proof, err
	}
	o.Audit, o.Logger = sink, log
	rep, err := Verify(ctx, ns, proof, o)
	return rep, proof, err
}

// Sources are the authoritative downstream stores a recovery reads its
// proof from.
type Sources struct {
	// CouchDB are fenced databases (each document's starintel_fence).
	CouchDB []CouchDBSource
	// RabbitMQURL is the broker's AMQP URL (it carries credentials), and
	// Queues its queues of fenced publications.
	RabbitMQURL string
	Queues      []string
	// MarksFiles are consumer marks files (rabbitmq.WriteMarksFile).
	MarksFiles []string
	// Complete asserts that these are every authoritative downstream
	// store (Proof.Complete).
	Complete bool
}

// Proof reads every source, in order: the CouchDB databases, the queues,
// the marks files. The first that fails ends it.
func (src Sources) Proof(ctx context.Context) (Proof, error) {
	proof := Proof{Complete: src.Complete}
	var err error
	for _, db := range src.CouchDB {
		if err = CouchDBProof(ctx, db, &proof); err != nil {
			break
		}
	}
	if err == nil && len(src.Queues) > 0 {
		err = RabbitMQProof(ctx, src.RabbitMQURL, src.Queues, &proof)
	}
	for _, mf := range src.MarksFiles {
		if err != nil {
			break
		}
		err = MarksFileProof(mf, &proof)
	}
	return proof, err
}
