package valkey

import (
	"context"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

// Stored formats. Evidence and history entries have two versions: 1, a
// copy of the record's JSON, which every build reads; and 2 ("compact",
// evidence.go), the facts one per line, about a third of the bytes, which
// only builds with evidence.go read. Active records have two versions
// too: 1, the record's JSON, and 2 (lease.CompactRecord, "rv2"), its
// lines, about half the bytes, which builds since read. Instances of
// several builds share a namespace during a rolling deploy, so a
// namespace is written in version 1 until an operator switches it, once
// every instance reads what the switch writes. The switch is the key
// layout.format(), read at Open and at every reaper pass:
//
//	(none)  version 1 everywhere
//	"2"     evidence and history in version 2 (EnableCompactFormat;
//	        `starlease serve --valkey-compact-format`)
//	"3"     that, and active records in version 2 (EnableCompactRecords;
//	        `--valkey-compact-records`)
//	"4"     that, but a new lease's record in version 3, carrying its
//	        acquisition's evidence (lease.EmbeddingRecord), and no
//	        evidence key until the lease ends; List index entries
//	        without the hash tag (EnableEmbeddedEvidence;
//	        `--valkey-embedded-evidence`)
//	"5"     that, and an ending's evidence of the lease's acquisition
//	        and a release's own in version 3, by reference to the
//	        lease's history entry (lease.ReferringEvidence), which is
//	        in version 4 and names that evidence by its scopes
//	        (lease.HistoryScopedPrefix), so that it is rewritten in
//	        version 2 before the entry is trimmed
//	        (EnableReferringEvidence; `--valkey-referring-evidence`)
//	"6"     that, but a record carrying its acquisition's evidence in
//	        version 4 (lease.LeanRecord): version 3 without its state
//	        line and the lease id's prefix, the digest in base64url, the
//	        times that acquire and renew derive left out; about 60 bytes
//	        less per active lease (EnableLeanRecords;
//	        `--valkey-lean-records`)
//	"7"     that, but evidence by reference in version 5
//	        (lease.LeanIDEvidence): version 3 without what the history
//	        entry it names derives (its code, backend time, expires_at,
//	        and a release's ttl_ms), the digest in base64url, and a check
//	        of the entry's bytes and its own; about 110 bytes less per
//	        ended lease (EnableLeanEvidence; `--valkey-lean-evidence`)
//	"8"     that, but evidence written whole (not by reference, and
//	        what detach rewrites) in version 6 (lease.WholeEvidence):
//	        version 2 without its hash tag line, the digest in
//	        base64url, and a check of its key's scope and its lines; and a
//	        history entry no evidence refers to in version 5
//	        (lease.HistoryUntaggedPrefix), version 2 without the tag
//	        line; about 45-50 bytes less per value (EnableCheckedEvidence;
//	        `--valkey-checked-evidence`)
//
// It is one way (raise_format in library.lua never lowers it; an instance
// of an older build would answer the later data as corrupt). Every build
// reads every version it knows.
//
// Options.EagerDetach is not a format but a choice of each instance in
// format 5 or later: an ending whose push drops an entry that ended within the
// idempotency retention writes format 4's forms (evidence and history
// version 2; in format 8 evidence version 6 and history version 5),
// which every build since format 3 reads (format 8's: since format 8),
// instead of writing by reference what the next trims would rewrite.
const (
	compactFormat     = "2"
	compactRecords    = "3"
	embeddedEvidence  = "4"
	referringEvidence = "5"
	leanRecords       = "6"
	leanEvidence      = "7"
	checkedEvidence   = "8"
)

// formatLevels orders the switch's values (library.lua's FORMAT_LEVEL):
// each format writes what the one below it does, and more.
var formatLevels = map[string]int32{compactFormat: 2, compactRecords: 3, embeddedEvidence: 4, referringEvidence: 5, leanRecords: 6, leanEvidence: 7,
	checkedEvidence: 8}

// writes reports whether the store writes format f's forms: its
// namespace's switch, as last read, is f or a later format.
func (s *Store) writes(f string) bool { return s.format.Load() >= formatLevels[f] }

// writeNames is the name library.lua's context takes (its WRITE_LEVEL)
// for the forms of each format level; any other level writes version 1.
var writeNames = map[int32]string{2: "compact", 3: "compact_records", 4: "embedded_evidence", 5: "referring_evidence",
	6: "lean_records", 7: "lean_evidence", 8: "checked_evidence"}

// writeFormat is the last ARGV of each call that keeps evidence, history
// or an active record (library.lua's context): the name of the
// namespace's format as last read, with "+eager" in format 5 or later for
// a store that detaches eagerly (Options.EagerDetach).
func (s *Store) writeFormat() string {
	level := s.format.Load()
	name, ok := writeNames[level]
	if !ok {
		return "v1"
	}
	if s.eagerDetach && level >= formatLevels[referringEvidence] {
		name += "+eager"
	}
	return name
}

// loadFormat reads the namespace's format switch. Unreadable, the store
// keeps the format it had: either is safe for this build's readers.
func (s *Store) loadFormat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := s.client.Do(ctx, s.client.B().Get().Key(s.keys.format()).Build()).ToString()
	switch {
	case err == nil:
		if _, known := formatLevels[v]; !known {
			s.log.Warn("unknown stored-format switch; writing version 1", "value_bytes", len(v))
		}
		s.setFormat(v)
	case vk.IsValkeyNil(err):
		s.setFormat("")
	default:
		s.log.Warn("cannot read the stored-format switch", "error_class", classify(err))
	}
}

// setFormat takes v, the namespace's switch, as the store's write format
// (version 1 for a value this build does not know).
func (s *Store) setFormat(v string) { s.format.Store(formatLevels[v]) }

// EnableCompactFormat switches the namespace to writing evidence and
// history in version 2, for this store at once and for every other
// instance at its next reaper pass. Only once every instance sharing the
// namespace runs a build that reads version 2.
func (s *Store) EnableCompactFormat(ctx context.Context) error {
	return s.raiseFormat(ctx, compactFormat)
}

// EnableCompactRecords switches the namespace to format 3: evidence,
// history and active records in version 2. Only once every instance
// sharing the namespace runs a build that reads version 2 records (this
// one or a later one).
func (s *Store) EnableCompactRecords(ctx context.Context) error {
	return s.raiseFormat(ctx, compactRecords)
}

// EnableEmbeddedEvidence switches the namespace to format 4: format 3's,
// but a new lease's acquisition evidence is kept in its active record
// (version 3) and written to its own key only when the lease ends. Only
// once every instance sharing the namespace runs a build that reads
// version 3 records (this one or a later one); older builds answer them
// as corrupt, and the lookup of an acquisition whose evidence one carries
// as not found. Rolling back: README, "--valkey-embedded-evidence".
func (s *Store) EnableEmbeddedEvidence(ctx context.Context) error {
	return s.raiseFormat(ctx, embeddedEvidence)
}

// EnableReferringEvidence switches the namespace to format 5: format 4's,
// but an ending's evidence of the lease's acquisition and a release's own
// refer to the lease's history entry instead of copying its facts (about
// 450 bytes less per ended lease). Only once every instance sharing the
// namespace runs a build that reads evidence version 3 and history
// version 4 (this one or a later one); older builds answer them as
// corrupt. Rolling back: README, "--valkey-referring-evidence".
func (s *Store) EnableReferringEvidence(ctx context.Context) error {
	return s.raiseFormat(ctx, referringEvidence)
}

// EnableLeanRecords switches the namespace to format 6: format 5's, but a
// record carrying its acquisition's evidence is stored in version 4
// (lease.LeanRecord).
// Only once every instance sharing the namespace runs a build that reads
// record version 4 (this one or a later one); older builds answer those
// records as corrupt. Rolling back: README, "--valkey-lean-records".
func (s *Store) EnableLeanRecords(ctx context.Context) error {
	return s.raiseFormat(ctx, leanRecords)
}

// EnableLeanEvidence switches the namespace to format 7: format 6's, but
// evidence by reference is stored in version 5 (lease.LeanIDEvidence).
// Only once every instance sharing the namespace runs a build that reads
// evidence version 5 (this one or a later one); older builds answer a
// replay of such evidence as corrupt. Rolling back: README,
// "--valkey-lean-evidence".
func (s *Store) EnableLeanEvidence(ctx context.Context) error {
	return s.raiseFormat(ctx, leanEvidence)
}

// EnableCheckedEvidence switches the namespace to format 8: format 7's,
// but evidence written whole is stored in version 6 (lease.WholeEvidence)
// and a history entry no evidence refers to in version 5
// (lease.HistoryUntaggedPrefix). Only once every instance sharing the
// namespace runs a build that reads both (this one or a later one); older
// builds answer a replay of such evidence, and such an entry, as corrupt.
// Rolling back: README, "--valkey-checked-evidence".
func (s *Store) EnableCheckedEvidence(ctx context.Context) error {
	return s.raiseFormat(ctx, checkedEvidence)
}

// errFormatClosed is raiseFormat's answer on a closed namespace, which
// changes nothing until it reopens.
var errFormatClosed = lease.Errorf(lease.CodeBackendUnavailable, "the namespace is closed; its stored-format switch is left as it is")

// raiseFormat sets the switch to want unless it holds want or a later
// format, then takes the namespace's format as its own. A switch holding
// a value this build does not know is left alone and refused; so is the
// switch of a closed namespace (errFormatClosed).
func (s *Store) raiseFormat(ctx context.Context, want string) error {
	rep, err := s.fcall(ctx, call{fn: "raise_format", keys: []string{s.keys.format(), s.keys.gate()}, args: []string{want}})
	if err != nil {
		return lease.Errorf(lease.CodeBackendUnavailable, "cannot switch the stored format: %s", lease.AsError(err).Reason)
	}
	switch rep.status {
	case "ok":
	case "closed":
		return errFormatClosed
	default:
		return lease.Errorf(lease.CodeCorrupt, "the stored-format switch holds a value this build does not know")
	}
	s.setFormat(rep.at(0))
	s.log.Info("AUDIT lease namespace stored format", "format", rep.at(0))
	return nil
}

// raiseWanted raises the switch to the format the store's options ask for
// (Options.CompactFormat, CompactRecords, EmbeddedEvidence,
// ReferringEvidence, LeanRecords, LeanEvidence, CheckedEvidence), if the
// namespace is below it.
// It runs at Open and at every reaper pass, so a namespace that was
// closed when the store opened is switched once it reopens.
func (s *Store) raiseWanted(ctx context.Context) error {
	if s.wantFormat == "" || s.writes(s.wantFormat) {
		return nil
	}
	return s.raiseFormat(ctx, s.wantFormat)
}
