package valkey

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	vk "github.com/valkey-io/valkey-go"

	"github.com/starintel/starlease/lease"
)

//go:embed library.lua
var librarySource string

// library is a function library with its content-addressed names.
type library struct {
	name   string // library name, e.g. starlease_v1_0123456789ab
	prefix string // function name prefix, e.g. sl1_0123456789ab_
	code   string
}

// newLibrary is the function library of an embedded Lua source, its
// library and function names carrying a hash of its code, so builds with
// different code never call each other's functions: the lease library
// (kind "") is starlease_v1_<hash> with functions sl1_<hash>_<fn>; one
// beside it, such as the credential store's (kind "cred"), is
// starlease_cred_v1_<hash> with functions slcred1_<hash>_<fn>.
func newLibrary(kind, src string) *library {
	sum := sha256.Sum256([]byte(src))
	h := hex.EncodeToString(sum[:6])
	name := "starlease_v1_" + h
	if kind != "" {
		name = "starlease_" + kind + "_v1_" + h
	}
	l := &library{name: name, prefix: "sl" + kind + "1_" + h + "_"}
	l.code = strings.NewReplacer("__LIBRARY__", l.name, "__FN__", l.prefix).Replace(src)
	return l
}

// functionMissing reports whether err is the server's answer to a call of
// a function it does not have: its library was never loaded or was
// flushed, so the function did not run.
func functionMissing(err error) bool {
	ve, ok := vk.IsValkeyErr(err)
	return ok && strings.Contains(ve.Error(), "Function not found")
}

// load installs the library unless a library of the same name (so the same
// code) already exists.
func (l *library) load(ctx context.Context, c vk.Client) error {
	err := c.Do(ctx, c.B().FunctionLoad().FunctionCode(l.code).Build()).Error()
	if ve, ok := vk.IsValkeyErr(err); ok && strings.Contains(ve.Error(), "already exists") {
		return nil
	}
	return err
}

// layout names keys; see the package documentation.
type layout struct{ ns string }

func (k layout) of(tag, kind string) string        { return k.ns + ":{" + tag + "}:" + kind }
func (k layout) active(tag string) string          { return k.of(tag, "active") }
func (k layout) counter(tag string) string         { return k.of(tag, "counter") }
func (k layout) history(tag string) string         { return k.of(tag, "history") }
func (k layout) marks(tag string) string           { return k.of(tag, "marks") }
func (k layout) commitSeq(tag string) string       { return k.of(tag, "cseq") }
func (k layout) quarantine(tag string) string      { return k.of(tag, "quarantine") }
func (k layout) idem(tag, scope string) string     { return k.of(tag, "idem:"+scope) }
func (k layout) commit(tag, scope string) string   { return k.of(tag, "commit:"+scope) }
func (k layout) index() string                     { return k.ns + ":index" }
func (k layout) expiry() string                    { return k.ns + ":expiry" }
func (k layout) leaseLookup(leaseID string) string { return k.ns + ":lease:" + leaseID }
func (k layout) probe() string                     { return k.ns + ":probe" }
func (k layout) outbox() string                    { return k.ns + ":outbox" }
func (k layout) outboxMsg(id string) string        { return k.ns + ":outbox:" + id }
func (k layout) outboxSeq() string                 { return k.ns + ":outbox_seq" }
func (k layout) outboxBytes() string               { return k.ns + ":outbox:bytes" }
func (k layout) outboxDead() string                { return k.ns + ":outbox_dead" }
func (k layout) outboxDeadWhy(id string) string    { return k.ns + ":outbox_dead:" + id }
func (k layout) outboxDeadEntry(id string) string  { return k.ns + ":outbox_dead_entry:" + id }
func (k layout) gate() string                      { return k.ns + ":gate" }
func (k layout) format() string                    { return k.ns + ":format" }
func (k layout) counterFloor() string              { return k.ns + ":counter_floor" }
func (k layout) epoch() string                     { return k.ns + ":epoch" }
func (k layout) lastRecovery() string              { return k.ns + ":last_recovery" }

// tagOf is the hash tag of a lock key: its opaque digest part.
func tagOf(lockKey string) string { return strings.TrimPrefix(lockKey, lease.KeyPrefix) }

// validTag reports whether t can be a lock key's digest part (43
// base64url characters); a stored lookup value is checked before it names
// a key.
func validTag(t string) bool {
	if len(t) != 43 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// call is one function invocation.
type call struct {
	fn       string // function name without prefix
	ro       bool   // FCALL_RO
	mutation bool   // a timeout after submission is outcome_unknown
	keys     []string
	args     []string
	// wait bounds the wait for the reply (zero: the context alone).
	wait time.Time
}

// reply is a function's answer: { status, backend time ms, fields... }.
type reply struct {
	status string
	now    lease.Timestamp
	f      []string
}

// at returns field i (0 is the first field after the backend time).
func (r reply) at(i int) string {
	if i < len(r.f) {
		return r.f[i]
	}
	return ""
}

// fcall runs one function and maps every failure to a typed error.
func (s *Store) fcall(ctx context.Context, c call) (reply, error) {
	if err := lease.CheckStart(ctx, s.closed.Load()); err != nil {
		return reply{}, err
	}
	cctx := ctx
	if !c.wait.IsZero() {
		if !time.Now().Before(c.wait) {
			// Nothing was sent; the backend would refuse it anyway.
			return reply{}, lease.DeadlineExceeded(lease.Timestamp{})
		}
		var cancel context.CancelFunc
		cctx, cancel = context.WithDeadline(ctx, c.wait)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		arr, err := s.client.Do(cctx, s.build(c)).ToArray()
		if err != nil {
			// A flushed or never-loaded library: the function did not run,
			// so loading it and calling again is safe.
			if attempt == 0 && functionMissing(err) {
				if lerr := s.lib.load(cctx, s.client); lerr == nil {
					continue
				}
			}
			return reply{}, s.failure(c, err)
		}
		f := make([]string, 0, len(arr))
		for i := range arr {
			v, err := arr[i].ToString()
			if err != nil && !arr[i].IsNil() {
				return reply{}, s.malformed(c)
			}
			f = append(f, v)
		}
		if len(f) < 2 {
			return reply{}, s.malformed(c)
		}
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return reply{}, s.malformed(c)
		}
		return reply{status: f[0], now: lease.UnixMilli(ms), f: f[2:]}, nil
	}
}

func (s *Store) build(c call) vk.Completed {
	name := s.lib.prefix + c.fn
	if c.ro {
		return s.client.B().FcallRo().Function(name).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
	}
	return s.client.B().Fcall().Function(name).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
}

func (s *Store) malformed(c call) error {
	s.log.Error("lease backend returned a malformed reply", "function", c.fn)
	if c.mutation {
		return lease.Errorf(lease.CodeOutcomeUnknown, "malformed backend reply; resolve by request id")
	}
	return lease.Errorf(lease.CodeBackendUnavailable, "malformed backend reply")
}

// failure maps a client error to a typed error; nothing of its text
// crosses the boundary.
func (s *Store) failure(c call, err error) error {
	class := classify(err)
	var de *dialError
	switch {
	case s.closed.Load() && !c.mutation:
		return lease.Errorf(lease.CodeBackendUnavailable, "store is closed")
	case errors.As(err, &de):
		// The connection could not be made: nothing was sent.
		return lease.Errorf(lease.CodeBackendUnavailable, "backend unreachable")
	case strings.HasPrefix(class, "server refused"):
		// Refused before the function ran (permissions, replica, memory,
		// loading, busy, persistence errors): nothing changed.
		s.log.Warn("lease backend refused a command", "function", c.fn, "class", class)
		return lease.Errorf(lease.CodeBackendUnavailable, "backend refused the operation")
	}
	if _, ok := vk.IsValkeyErr(err); ok && !c.mutation {
		s.log.Warn("lease backend read failed", "function", c.fn, "class", class)
		return lease.Errorf(lease.CodeBackendUnavailable, "backend error")
	}
	if !c.mutation {
		return lease.Errorf(lease.CodeBackendUnavailable, "backend did not answer")
	}
	// The command may have reached the server and committed: a timeout, a
	// reset, a closed connection or a script failure after submission.
	s.log.Warn("lease backend outcome unknown", "function", c.fn, "class", class)
	return lease.Errorf(lease.CodeOutcomeUnknown, "backend outcome unknown; resolve by request id")
}

// waitFor bounds a mutation's wait for its reply: the deadline plus the
// reply grace, within which a function that started in time has answered.
func (s *Store) waitFor(d lease.Timestamp) time.Time { return d.Time().Add(s.replyGrace) }

func itoa(v int64) string       { return strconv.FormatInt(v, 10) }
func utoa(v uint64) string      { return strconv.FormatUint(v, 10) }
func ms(d time.Duration) string { return itoa(d.Milliseconds()) }
