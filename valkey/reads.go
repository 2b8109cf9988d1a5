package valkey

import (
	"context"
	"strconv"
	"strings"

	"github.com/starintel/starlease/lease"
)

// read runs a read-only function under deadline d, which the function
// enforces at backend time.
func (s *Store) read(ctx context.Context, d lease.Timestamp, fn string, keys []string, args ...string) (reply, error) {
	rep, err := s.fcall(ctx, call{fn: fn, ro: true, keys: keys, args: append([]string{itoa(d.UnixMilli())}, args...), wait: s.waitFor(d)})
	if err == nil && rep.status == "deadline" {
		return reply{}, lease.DeadlineExceeded(rep.now)
	}
	return rep, err
}

// Inspect reads the lease of an identity (active, or expired if its time
// has passed) or a lease by id (active or terminal).
func (s *Store) Inspect(ctx context.Context, req lease.InspectRequest) (lease.Result, error) {
	req, lockKey, err := lease.PrepareInspect(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	d := lease.Deadline(ctx, req.DeadlineAt)
	if req.LeaseID == "" {
		id, tag := req.Identity, tagOf(lockKey)
		rep, err := s.read(ctx, d, "inspect", []string{s.keys.active(tag)},
			lockKey, id.TenantID, id.ProgramID, id.TargetNamespace, id.TargetID, id.ActorName, id.WorkflowName, id.OperationClass)
		if err != nil {
			return lease.Result{}, err
		}
		switch rep.status {
		case "corrupt":
			return lease.Result{}, s.corrupt(id, rep.at(0))
		case "ok":
			cur, err := s.decodeActive(rep.at(0), rep.at(1), lockKey, id)
			if err != nil {
				return lease.Result{}, err
			}
			if cur == nil {
				return lease.Result{}, lease.NotFound(rep.now)
			}
			return lease.Result{Code: lease.CodeInspected, Lease: cur.ObservedAt(rep.now), BackendTime: rep.now}, nil
		}
		return lease.Result{}, s.malformed(call{fn: "inspect"})
	}

	// By id: the lookup key names the identity (it never changes once
	// written), then one atomic read of that identity decides.
	ref, err := s.read(ctx, d, "resolve", []string{s.keys.leaseLookup(req.LeaseID)})
	if err != nil {
		return lease.Result{}, err
	}
	tag := ref.at(0)
	if ref.status != "ok" || tag == "" {
		return lease.Result{}, lease.NotFound(ref.now)
	}
	if !validTag(tag) {
		return lease.Result{}, s.corrupt(lease.Identity{}, "lease-id lookup holds a malformed value")
	}
	lockKey = lease.KeyPrefix + tag
	rep, err := s.read(ctx, d, "inspect_id", []string{s.keys.active(tag), s.keys.history(tag)}, lockKey, req.LeaseID)
	if err != nil {
		return lease.Result{}, err
	}
	switch rep.status {
	case "corrupt":
		return lease.Result{}, s.corrupt(lease.Identity{}, rep.at(0))
	case "active":
		cur, err := s.decodeActive(rep.at(0), rep.at(1), lockKey, lease.Identity{})
		if err != nil {
			return lease.Result{}, err
		}
		if cur != nil && cur.LeaseID == req.LeaseID {
			return lease.Result{Code: lease.CodeInspected, Lease: cur.ObservedAt(rep.now), BackendTime: rep.now}, nil
		}
		return lease.Result{}, lease.NotFound(rep.now)
	case "history":
		if h, _ := findHistory(rep.f, lockKey, req.LeaseID); h != nil {
			return lease.Result{Code: lease.CodeInspected, Lease: h.Record, BackendTime: rep.now}, nil
		}
		return lease.Result{}, lease.NotFound(rep.now)
	}
	return lease.Result{}, s.malformed(call{fn: "inspect_id"})
}

// List pages through unexpired active leases of one filter in lease-id
// order. Each step reads a chunk of the filter's index range, then the
// chunk's active records in one atomic read; like the reference backend it
// examines at most 4×page size + 64 entries per page, so a page costs
// O(page size) whatever the number of stale entries, plus, once that
// budget is spent, at most two more: the rest of the last lease's members
// (a lease has one of each form, tag-free first), so the cursor moves past
// a lease id only once every member of it has been consumed.
func (s *Store) List(ctx context.Context, req lease.ListRequest) (lease.ListResult, error) {
	pg, err := lease.PrepareList(req, s.opts)
	if err != nil {
		return lease.ListResult{}, err
	}
	f, after, size := pg.Filter, pg.After, pg.Size
	prefix := string(f.By) + "\x00" + f.Value // index members: filter ‖ 0 ‖ value ‖ lease id [‖ 0 ‖ tag]
	upper := "(" + prefix + "\xff"
	d := lease.Deadline(ctx, req.DeadlineAt)
	out := lease.ListResult{Leases: []*lease.Record{}}
	budget := 4*size + 64
	// Once the budget is spent, members of the last consumed lease id are
	// still consumed, at most spare of them: a page whose budget ends on a
	// lease's tag-free member (its lookup gone) must still examine its
	// tagged one, which may list it, since the cursor will exclude both.
	spare := 2
	lower := "[" + prefix
	if after != "" {
		// Members with lease id `after` end there or continue with 0, so
		// this bound excludes exactly them and everything before.
		lower = "[" + prefix + after + "\x01"
	}
	for {
		// A chunk is a page's size (or what is left of the budget),
		// whatever the slots left: a nearly full page then costs a few
		// rounds, not one per member. Members after the page fills are
		// read but not consumed: the cursor is the last one consumed.
		want := min(size, budget)
		if budget == 0 {
			want = spare
		}
		page, err := s.read(ctx, d, "index_page", []string{s.keys.index()}, lower, upper, strconv.Itoa(want+1))
		if err != nil {
			return lease.ListResult{}, err
		}
		out.BackendTime = page.now
		examine := page.f[:min(len(page.f), want)]
		entries, keys, err := s.listEntries(ctx, d, prefix, examine)
		if err != nil {
			return lease.ListResult{}, err
		}
		var recs reply
		if len(keys) > 0 {
			if recs, err = s.read(ctx, d, "actives", keys); err != nil {
				return lease.ListResult{}, err
			}
			out.BackendTime = recs.now
		}
		j, consumed := 0, 0
		for i, e := range entries {
			if len(out.Leases) == size {
				break
			}
			if budget > 0 {
				budget--
			} else if spare > 0 && e.leaseID != "" && e.leaseID == after {
				spare--
			} else {
				break // the budget is spent, and the last lease's members with it
			}
			consumed = i + 1
			lower = "(" + examine[i]
			if e.leaseID != "" {
				// Every member whose lease id parsed moves the cursor past
				// it, listed or not: one with no tag (its lookup gone: the
				// lease ended) too, so a run of them longer than the budget
				// never answers the page's own cursor again.
				after = e.leaseID
			}
			if e.tag == "" {
				continue
			}
			rec, err := s.decodeActive(recs.at(2*j), recs.at(2*j+1), lease.KeyPrefix+e.tag, lease.Identity{})
			j++
			if err != nil || rec == nil || rec.LeaseID != e.leaseID || !f.Selects(rec) || !rec.LiveAt(recs.now) {
				continue // corrupt (already alerted), ended or expired: not listed
			}
			if n := len(out.Leases); n > 0 && out.Leases[n-1].LeaseID == rec.LeaseID {
				// Its members in both forms (a restore or a repair may mix
				// them) sort together and resolve to the same record.
				continue
			}
			out.Leases = append(out.Leases, rec)
		}
		if consumed == len(examine) && len(page.f) <= want {
			return out, nil // the filter's range is exhausted
		}
		if len(out.Leases) == size || budget == 0 && (consumed < len(examine) || spare == 0 || !memberOf(page.f[len(examine)], prefix, after)) {
			if after == "" || after == pg.After {
				// A whole budget of members with no lease id: a token
				// would name no cursor, or the one this page started at.
				s.log.Error("ALERT list index page made no progress: a page's budget of malformed members")
				return lease.ListResult{}, lease.Errorf(lease.CodeBackendUnavailable, "malformed list index")
			}
			out.NextPageToken = pg.NextPageToken(after)
			return out, nil
		}
	}
}

// memberOf reports whether the index member m (after prefix) is one of
// lease id's, in either form: prefix ‖ id, or prefix ‖ id ‖ 0 ‖ tag.
func memberOf(m, prefix, id string) bool {
	rest, ok := strings.CutPrefix(m, prefix+id)
	return ok && id != "" && (rest == "" || rest[0] == 0)
}

// listEntry is an index member List examines: its lease id ("" if it did
// not parse) and hash tag ("" for a member skipped: malformed, or its
// lease's lookup gone).
type listEntry struct{ leaseID, tag string }

// listEntries reads index members (after prefix): lease id ‖ 0 ‖ tag, or
// from format 4 the lease id alone, whose tag the lease-id lookup holds
// (one read for the chunk's). It returns an entry per member, in order,
// and the active keys of those with a tag.
func (s *Store) listEntries(ctx context.Context, d lease.Timestamp, prefix string, members []string) ([]listEntry, []string, error) {
	entries := make([]listEntry, len(members))
	var lookups []string
	var at []int
	for i, m := range members {
		rest, ok := strings.CutPrefix(m, prefix)
		id, tag, tagged := strings.Cut(rest, "\x00")
		switch {
		case !ok || tagged && !validTag(tag) || !tagged && lease.CheckOpaqueID("lease_id", id) != nil:
			s.log.Error("ALERT malformed list index entry skipped")
			if ok && lease.CheckOpaqueID("lease_id", id) == nil {
				entries[i].leaseID = id // skipped, but the cursor moves past it
			}
		case tagged:
			entries[i] = listEntry{id, tag}
		default:
			entries[i].leaseID = id
			lookups = append(lookups, s.keys.leaseLookup(id))
			at = append(at, i)
		}
	}
	if len(lookups) > 0 {
		rep, err := s.read(ctx, d, "actives", lookups)
		if err != nil {
			return nil, nil, err
		}
		for j, i := range at {
			switch tag := rep.at(2 * j); {
			case tag == "":
				// The lookup outlives every live lease: this one ended.
			case !validTag(tag):
				s.log.Error("ALERT malformed lease-id lookup; list index entry skipped")
			default:
				entries[i].tag = tag
			}
		}
	}
	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.tag != "" {
			keys = append(keys, s.keys.active(e.tag))
		}
	}
	return entries, keys, nil
}

// History pages through an identity's terminal evidence, newest first.
// Entries are pushed in token order (an identity's leases end one after
// another), so the page token is the fencing token of the next entry.
func (s *Store) History(ctx context.Context, req lease.HistoryRequest) (lease.HistoryResult, error) {
	pg, err := lease.PrepareHistory(req, s.opts)
	if err != nil {
		return lease.HistoryResult{}, err
	}
	lockKey, after, size := pg.LockKey, pg.After, pg.Size
	var cursor uint64
	if after != "" {
		if cursor, err = strconv.ParseUint(after, 10, 64); err != nil {
			return lease.HistoryResult{}, lease.Invalid("page_token", "malformed")
		}
	}
	tag := tagOf(lockKey)
	rep, err := s.read(ctx, lease.Deadline(ctx, req.DeadlineAt), "history", []string{s.keys.history(tag)})
	if err != nil {
		return lease.HistoryResult{}, err
	}
	out := lease.HistoryResult{Entries: []lease.HistoryEntry{}, BackendTime: rep.now}
	for _, raw := range rep.f {
		h, err := lease.DecodeScopedHistory([]byte(raw), lockKey)
		if err == nil && h.Record.LockKey != lockKey {
			err = lease.Errorf(lease.CodeCorrupt, "history entry of a foreign lock key")
		}
		if err != nil {
			s.corrupt(pg.Identity, "history entry is corrupt")
			continue
		}
		// Resume at the entry the token names, or the next older one if
		// retention removed it.
		if after != "" && h.Record.FencingToken > cursor {
			continue
		}
		if len(out.Entries) == size {
			out.NextPageToken = pg.NextPageToken(utoa(h.Record.FencingToken))
			break
		}
		out.Entries = append(out.Entries, *h)
	}
	return out, nil
}

// LookupRequest returns the stored result of a mutation by its request id.
func (s *Store) LookupRequest(ctx context.Context, req lease.LookupRequest) (lease.Result, error) {
	p, err := lease.PrepareLookup(req, s.opts)
	if err != nil {
		return lease.Result{}, err
	}
	tag := tagOf(p.LockKey)
	// An acquire's evidence may be in its active record (format 4).
	embedded := ""
	if p.Op == lease.OpAcquire {
		embedded = p.Scope
	}
	rep, err := s.read(ctx, lease.Deadline(ctx, req.DeadlineAt), "lookup", []string{s.keys.idem(tag, p.Scope), s.keys.active(tag), s.keys.history(tag)},
		embedded, p.LockKey)
	if err != nil {
		return lease.Result{}, err
	}
	switch rep.status {
	case "embedded":
		raw, current, err := s.embeddedAcquisition(p, rep)
		if err != nil {
			return lease.Result{}, err
		}
		res, ok := p.Lookup(raw, current)
		if !ok {
			return lease.Result{}, s.corrupt(p.Identity, "embedded idempotency evidence is corrupt")
		}
		return res, nil
	case "none":
		return lease.Result{}, lease.RequestNotFound(rep.now)
	case "corrupt":
		return lease.Result{}, s.corrupt(p.Identity, rep.at(0))
	case "evidence":
		raw, ok := evidenceBytes(p, rep)
		if !ok {
			return lease.Result{}, s.corrupt(p.Identity, "idempotency evidence is corrupt")
		}
		res, ok := p.Lookup([]byte(raw), func(orig *lease.Record) (*lease.Record, error) { return s.currentOf(orig, rep, p.Identity) })
		if !ok {
			return lease.Result{}, s.corrupt(p.Identity, "idempotency evidence is corrupt")
		}
		return res, nil
	}
	return lease.Result{}, s.malformed(call{fn: "lookup"})
}
