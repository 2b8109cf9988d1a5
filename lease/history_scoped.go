package lease

import (
	"bytes"
	"strings"
)

// History version 4 ("hv4"; Valkey from stored format 5) is version 2
// without its hash tag line (the key the entry is stored under holds it)
// and with the idempotency scopes of the evidence that refers to the
// entry (evidence version 3: an ending's evidence of the lease's
// acquisition and a release's own) on two lines after the version: the
// acquisition's scope and the release's, each empty or the scope itself. The store
// rewrites that evidence in version 2 before it drops the entry, and
// names the evidence keys by these lines: its server-side library cannot
// compute a scope (a SHA-256). Each line must be empty or exactly the
// scope the entry's own facts give (IdempotencyScope: the owner and
// request id of the acquisition; ended_by and request_id of a release),
// so a damaged line fails decoding like any other.
//
//	hv4\n<acquisition scope>\n<release scope>\n<version 2's five ending lines>\n<version 2's lines after the tag>
const HistoryScopedPrefix = "hv4\n"

// History version 5 ("hv5"; Valkey from stored format 8) is version 2
// without its hash tag line, for an entry no evidence refers to (which
// version 4 would name none in, and which it refuses): the key the entry
// is stored under holds the tag, as for version 4.
//
//	hv5\n<version 2's five ending lines>\n<version 2's lines after the tag>
const HistoryUntaggedPrefix = "hv5\n"

// DecodeScopedHistory strictly decodes a stored history entry of version
// 1, 2, 4 or 5 found under a key that holds lockKey (version 4: its scope
// lines checked and removed; 4 and 5: lockKey's hash tag put back, then
// read as DecodeStoredHistory reads version 2).
func DecodeScopedHistory(raw []byte, lockKey string) (*HistoryEntry, error) {
	if bytes.HasPrefix(raw, []byte(HistoryUntaggedPrefix)) {
		var f [7]string // version, five ending lines, the rest
		if !splitLines(string(raw), f[:]) {
			return nil, corrupt("history: version 5 entry is malformed")
		}
		return retagged(f[1:6], f[6], lockKey, "5")
	}
	if !bytes.HasPrefix(raw, []byte(HistoryScopedPrefix)) {
		return DecodeStoredHistory(raw)
	}
	var f [9]string // version, two scopes, five ending lines, the rest
	if !splitLines(string(raw), f[:]) {
		return nil, corrupt("history: version 4 entry is malformed")
	}
	acquisition, release := f[1], f[2]
	if acquisition == "" && release == "" {
		return nil, corrupt("history: version 4 entry names no evidence") // written as version 2
	}
	h, err := retagged(f[3:8], f[8], lockKey, "4")
	if err != nil {
		return nil, err
	}
	if acquisition != "" && acquisition != h.EvidenceScope(OpAcquire) {
		return nil, corrupt("history: version 4 entry's acquisition scope is not its own")
	}
	if release != "" && (h.Record.State != StateReleased || h.EndedBy == "" || h.RequestID == "" ||
		release != h.EvidenceScope(OpRelease)) {
		return nil, corrupt("history: version 4 entry's release scope is not its own")
	}
	return h, nil
}

// retagged strictly decodes the version 2 entry of ending, its five
// ending lines, and rest, its lines after the tag, with lockKey's hash
// tag between them: an entry of version (4 or 5, without the tag line)
// found under a key that holds lockKey. An entry of another lock key is
// corrupt.
func retagged(ending []string, rest, lockKey, version string) (*HistoryEntry, error) {
	tag, ok := strings.CutPrefix(lockKey, KeyPrefix)
	if !ok {
		return nil, corrupt("history: version " + version + " entry is malformed")
	}
	h, err := DecodeStoredHistory([]byte(HistoryV2Prefix + strings.Join(ending, "\n") + "\n" + tag + "\n" + rest))
	if err == nil && h.Record.LockKey != lockKey {
		err = corrupt("history: version " + version + " entry of a foreign lock key")
	}
	return h, err
}
