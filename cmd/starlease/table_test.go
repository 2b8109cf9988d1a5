package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/lease"
)

// parsedTable is a table as printed: the header, the rows (cells unquoted)
// and the next page token.
type parsedTable struct {
	header []string
	rows   [][]string
	next   string
}

// parseTable parses --output table and checks that the columns are
// aligned: every cell starts where its header does.
func parseTable(t *testing.T, out string) parsedTable {
	t.Helper()
	body, footer, _ := strings.Cut(out, "\n\n")
	lines := strings.Split(strings.TrimRight(body, "\n"), "\n")
	var p parsedTable
	var starts []int
	for i, line := range lines {
		cells, at := splitCells(t, line)
		if i == 0 {
			p.header, starts = cells, at
			continue
		}
		if len(cells) != len(p.header) {
			t.Fatalf("row %d has %d cells, the header %d:\n%s", i, len(cells), len(p.header), out)
		}
		for j := range at {
			if at[j] != starts[j] {
				t.Fatalf("row %d: column %s starts at %d, its header at %d:\n%s", i, p.header[j], at[j], starts[j], out)
			}
		}
		p.rows = append(p.rows, cells)
	}
	if footer != "" {
		tok, ok := strings.CutPrefix(strings.TrimSpace(footer), "next_page_token: ")
		if !ok {
			t.Fatalf("footer %q", footer)
		}
		p.next = tok
	}
	return p
}

// splitCells splits a line at runs of spaces; a cell starting with a quote
// is a Go-quoted string.
func splitCells(t *testing.T, line string) (cells []string, starts []int) {
	t.Helper()
	for i := 0; i < len(line); {
		if line[i] == ' ' {
			i++
			continue
		}
		starts = append(starts, i)
		if line[i] == '"' {
			q, err := strconv.QuotedPrefix(line[i:])
			if err != nil {
				t.Fatalf("bad quoted cell in %q: %v", line, err)
			}
			v, _ := strconv.Unquote(q)
			cells = append(cells, v)
			i += len(q)
			continue
		}
		j := strings.IndexByte(line[i:], ' ')
		if j < 0 {
			j = len(line) - i
		}
		cells = append(cells, line[i:i+j])
		i += j
	}
	return cells, starts
}

// col is the cell of column name in row.
func (p parsedTable) col(t *testing.T, row []string, name string) string {
	t.Helper()
	for i, h := range p.header {
		if h == name {
			return row[i]
		}
	}
	t.Fatalf("no column %s in %v", name, p.header)
	return ""
}

var remainingRE = regexp.MustCompile(`^(\d+\.\d)s$`)

// checkLeaseRow compares a table row with the server's lease: every
// column, times in UTC RFC 3339, the remaining TTL against expires_at.
func checkLeaseRow(t *testing.T, p parsedTable, row []string, l client.Lease, printedAt time.Time) {
	t.Helper()
	id := l.LockIdentity
	want := map[string]string{"TENANT": id.TenantID, "PROGRAM": id.ProgramID, "NAMESPACE": id.TargetNamespace,
		"TARGET": id.TargetID, "ACTOR": id.ActorName, "WORKFLOW": id.WorkflowName, "CLASS": id.OperationClass,
		"LEASE_ID": l.LeaseID, "TOKEN": strconv.FormatUint(l.FencingToken, 10), "STATE": string(l.State), "OWNER": "-"}
	for k, v := range want {
		if got := p.col(t, row, k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	exp := p.col(t, row, "EXPIRES_AT")
	ts, err := time.Parse(time.RFC3339, exp)
	if err != nil || !strings.HasSuffix(exp, "Z") || !ts.Equal(l.ExpiresAt) {
		t.Errorf("EXPIRES_AT %q (%v), want %s in UTC RFC 3339", exp, err, l.ExpiresAt)
	}
	m := remainingRE.FindStringSubmatch(p.col(t, row, "REMAINING"))
	if m == nil {
		t.Fatalf("REMAINING %q, want seconds like 12.3s", p.col(t, row, "REMAINING"))
	}
	left, _ := strconv.ParseFloat(m[1], 64)
	// Printed between printedAt and now, truncated to a tenth.
	lo, hi := time.Until(l.ExpiresAt).Seconds()-0.1, l.ExpiresAt.Sub(printedAt).Seconds()
	if left < lo-0.05 || left > hi+0.05 || left > float64(l.TTLMs)/1000 {
		t.Errorf("REMAINING %.1fs, want within [%.2f, %.2f]", left, lo, hi)
	}
}

// --output table on list, inspect and history, remotely: the columns in
// their order, each cell the server's value.
func TestRemoteTableOutput(t *testing.T) {
	f := newRemote(t)
	a := f.acquire(t, "--ttl", "40s")
	b := f.acquire(t, "--target", "example.org", "--ttl", "50s")

	before := time.Now()
	r := f.run(t, append([]string{"list", "--output", "table"}, append(f.mode(), "--tenant", "acme", "--program", "p1")...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("list: exit %d\n%s", r.code, r.stderr)
	}
	p := parseTable(t, r.stdout)
	if strings.Join(p.header, " ") != strings.Join(leaseColumns, " ") ||
		strings.Join(leaseColumns, " ") != "TENANT PROGRAM NAMESPACE TARGET ACTOR WORKFLOW CLASS LEASE_ID TOKEN STATE OWNER EXPIRES_AT REMAINING" {
		t.Fatalf("header %v", p.header)
	}
	if len(p.rows) != 2 || p.next != "" {
		t.Fatalf("list rows: %+v", p)
	}
	for i, rec := range []*lease.Record{a, b} {
		if p.col(t, p.rows[i], "LEASE_ID") != rec.LeaseID {
			t.Fatalf("row %d is not lease %s (server order)", i, rec.LeaseID)
		}
		checkLeaseRow(t, p, p.rows[i], f.held(t, rec.LeaseID), before)
	}

	// Paged: the next page token follows the table.
	r = f.run(t, append([]string{"list", "--output", "table", "--page-size", "1"}, append(f.mode(), "--owner", "ops-admin")...)...)
	p = parseTable(t, r.stdout)
	if len(p.rows) != 1 || p.next == "" {
		t.Fatalf("paged table: %q", r.stdout)
	}
	r = f.run(t, append([]string{"list", "--output", "table", "--page-size", "1", "--page-token", p.next}, append(f.mode(), "--owner", "ops-admin")...)...)
	if p2 := parseTable(t, r.stdout); len(p2.rows) != 1 || p2.next != "" || p2.rows[0][7] == p.rows[0][7] {
		t.Fatalf("page 2: %q", r.stdout)
	}

	before = time.Now()
	r = f.do(t, "inspect", "--output", "table")
	p = parseTable(t, r.stdout)
	if len(p.rows) != 1 {
		t.Fatalf("inspect table: %q", r.stdout)
	}
	checkLeaseRow(t, p, p.rows[0], f.held(t, a.LeaseID), before)

	// History: both ended leases, newest first; the reason, free text, is
	// the last column, quoted as it has a space.
	f.do(t, "force-release", append(leaseFlags(a), "--reason", "stuck worker")...).ok(t, &printedLease{})
	c := f.acquire(t)
	f.do(t, "revoke", append(leaseFlags(c), "--incident", "inc-9")...).ok(t, &printedLease{})
	r = f.run(t, append([]string{"history", "--output", "table"}, append(f.mode(), "--lease-id", a.LeaseID)...)...)
	if !strings.Contains(r.stdout, `"stuck worker"`) {
		t.Fatalf("the reason is not quoted: %q", r.stdout)
	}
	p = parseTable(t, r.stdout)
	if strings.Join(p.header, " ") != "ENDED_AT STATE LEASE_ID TOKEN TENANT PROGRAM NAMESPACE TARGET ACTOR WORKFLOW CLASS ACQUIRED_AT INCIDENT REASON" {
		t.Fatalf("history header %v", p.header)
	}
	server, err := f.api.History(context.Background(), a.LeaseID, 0, "")
	if err != nil || len(server.History) != 2 || len(p.rows) != 2 {
		t.Fatalf("history: table %+v, server %+v, %v", p, server, err)
	}
	for i, h := range server.History {
		row := p.rows[i]
		want := map[string]string{"ENDED_AT": h.EndedAt.UTC().Format("2006-01-02T15:04:05.000Z"), "STATE": string(h.State),
			"LEASE_ID": h.LeaseID, "TOKEN": strconv.FormatUint(h.FencingToken, 10), "TARGET": h.LockIdentity.TargetID,
			"ACQUIRED_AT": h.AcquiredAt.UTC().Format("2006-01-02T15:04:05.000Z"), "INCIDENT": orDash(h.IncidentID), "REASON": orDash(h.Reason)}
		for k, v := range want {
			if got := p.col(t, row, k); got != v {
				t.Errorf("history row %d %s: %q, want %q", i, k, got, v)
			}
		}
	}
	if p.col(t, p.rows[0], "INCIDENT") != "inc-9" || p.col(t, p.rows[1], "REASON") != "stuck worker" {
		t.Fatalf("history rows: %v", p.rows)
	}
	f.do(t, "inspect", "--output", "yaml").refused(t, exitUsage, lease.CodeInvalidRequest)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// The table works in local mode too, where the owner is known and the
// remaining TTL counts from the backend time of the answer.
func TestLocalTableOutput(t *testing.T) {
	f := newFixture(t)
	rec := f.acquire(t, "--ttl", "12s")
	r := runCLI(t, "list", "--data-dir", f.dir, "--tenant", "acme", "--program", "p1", "--output", "table")
	p := parseTable(t, r.stdout)
	if r.code != 0 || len(p.rows) != 1 {
		t.Fatalf("list: exit %d %q", r.code, r.stdout)
	}
	row := p.rows[0]
	if p.col(t, row, "OWNER") != "local-operator" || p.col(t, row, "LEASE_ID") != rec.LeaseID ||
		p.col(t, row, "EXPIRES_AT") != rec.ExpiresAt.String() {
		t.Fatalf("row %v, lease %+v", row, rec)
	}
	m := remainingRE.FindStringSubmatch(p.col(t, row, "REMAINING"))
	if m == nil {
		t.Fatalf("REMAINING %q", p.col(t, row, "REMAINING"))
	}
	if left, _ := strconv.ParseFloat(m[1], 64); left > 12 || left < 10 {
		t.Fatalf("REMAINING %q of a 12s lease just acquired", m[0])
	}
	f.do(t, "release", held(rec)...).ok(t, &printedLease{})
	r = runCLI(t, "inspect", "--data-dir", f.dir, "--lease-id", rec.LeaseID, "--output", "table")
	if p := parseTable(t, r.stdout); len(p.rows) != 1 || p.col(t, p.rows[0], "STATE") != "released" || p.col(t, p.rows[0], "REMAINING") != "-" {
		t.Fatalf("ended lease: %q", r.stdout)
	}
	r = runCLI(t, "history", "--data-dir", f.dir, "--lease-id", rec.LeaseID, "--output", "table")
	if p := parseTable(t, r.stdout); len(p.rows) != 1 || p.col(t, p.rows[0], "LEASE_ID") != rec.LeaseID {
		t.Fatalf("local history by lease id: %q", r.stdout)
	}
	// An empty list is the header alone.
	r = runCLI(t, "list", "--data-dir", f.dir, "--tenant", "acme", "--program", "p1", "--output", "table")
	if p := parseTable(t, r.stdout); r.code != 0 || len(p.rows) != 0 || len(p.header) != len(leaseColumns) {
		t.Fatalf("empty list: %q", r.stdout)
	}
}

func TestRemainingAndCells(t *testing.T) {
	now := time.Date(2026, 8, 5, 12, 0, 0, 0, time.UTC)
	rec := &lease.Record{State: lease.StateActive, ExpiresAt: lease.At(now.Add(12345 * time.Millisecond))}
	for _, c := range []struct {
		state lease.State
		at    time.Time
		want  string
	}{
		{lease.StateActive, now, "12.3s"},
		{lease.StateActive, now.Add(12300 * time.Millisecond), "0.0s"},
		{lease.StateActive, now.Add(12345 * time.Millisecond), "expired"},
		{lease.StateActive, now.Add(time.Hour), "expired"},
		{lease.StateActive, now.Add(-100 * time.Second), "112.3s"},
		{lease.StateReleased, now, "-"},
		{lease.StateExpired, now, "-"},
	} {
		r := *rec
		r.State = c.state
		if got := remaining(&r, c.at); got != c.want {
			t.Errorf("remaining(%s, %v) = %q, want %q", c.state, c.at.Sub(now), got, c.want)
		}
	}
	for in, want := range map[string]string{"": "-", "-": `"-"`, "acme": "acme", "stuck worker": `"stuck worker"`,
		"tab\there": `"tab\there"`, "\x1b[31mred": `"\x1b[31mred"`, `"q`: `"\"q"`, "héllo": "héllo"} {
		if got := cell(in); got != want {
			t.Errorf("cell(%q) = %q, want %q", in, got, want)
		}
	}
}
