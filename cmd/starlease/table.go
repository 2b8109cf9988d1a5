package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/starintel/starlease/lease"
)

// Output formats of list, inspect and history.
const (
	outputJSON  = "json"
	outputTable = "table"
)

// outputFlag registers --output.
func outputFlag(fs *flag.FlagSet) *string {
	return fs.String("output", outputJSON, `output format: json, or table (aligned columns for humans: times in UTC RFC 3339, remaining TTL)`)
}

// setOutput checks and records the output format.
func (e *env) setOutput(v string) error {
	switch v {
	case outputJSON, outputTable:
		e.output = v
		return nil
	}
	return lease.Invalid("output", `must be "json" or "table"`)
}

// tabular is a result with a table form.
type tabular interface {
	// table returns the header and rows; now is the local time, used when
	// the result carries no backend time to count the remaining TTL from.
	table(now time.Time) (header []string, rows [][]string)
	// nextPageToken is the token of the next page, empty on the last.
	nextPageToken() string
}

// The columns of a lease, in this order (list and inspect). REMAINING is
// the time left until expires_at, counted from the backend time of the
// answer when it has one (local mode), else from this host's clock: "12.3s",
// "expired" for an active lease past its expiry, "-" for an ended lease.
var leaseColumns = []string{"TENANT", "PROGRAM", "NAMESPACE", "TARGET", "ACTOR", "WORKFLOW", "CLASS",
	"LEASE_ID", "TOKEN", "STATE", "OWNER", "EXPIRES_AT", "REMAINING"}

// The columns of a history entry, in this order; REASON, free text, last.
var historyColumns = []string{"ENDED_AT", "STATE", "LEASE_ID", "TOKEN", "TENANT", "PROGRAM", "NAMESPACE", "TARGET",
	"ACTOR", "WORKFLOW", "CLASS", "ACQUIRED_AT", "INCIDENT", "REASON"}

func leaseRow(rec *lease.Record, now time.Time) []string {
	return []string{cell(rec.TenantID), cell(rec.ProgramID), cell(rec.TargetNamespace), cell(rec.TargetID),
		cell(rec.ActorName), cell(rec.WorkflowName), cell(rec.OperationClass), cell(rec.LeaseID),
		strconv.FormatUint(rec.FencingToken, 10), cell(string(rec.State)), cell(rec.OwnerPrincipalID),
		timeCell(rec.ExpiresAt), remaining(rec, now)}
}

// remaining is the REMAINING cell: tenths of seconds, truncated.
func remaining(rec *lease.Record, now time.Time) string {
	if rec.State != lease.StateActive {
		return "-"
	}
	left := rec.ExpiresAt.Time().Sub(now)
	if left <= 0 {
		return "expired"
	}
	return strconv.FormatFloat(left.Truncate(100*time.Millisecond).Seconds(), 'f', 1, 64) + "s"
}

// timeCell is a timestamp in UTC RFC 3339 with milliseconds, or "-".
func timeCell(ts lease.Timestamp) string {
	if ts.IsZero() {
		return "-"
	}
	return ts.String()
}

// cell is a value as one whitespace-free column: "-" when empty, quoted
// (Go syntax) when it holds white space, control or other non-printable
// characters, or starts with a quote or is "-" itself, so a reader (or
// terminal) never sees a value split, misread or interpreted.
func cell(v string) string {
	if v == "" {
		return "-"
	}
	if v == "-" || strings.HasPrefix(v, `"`) || strings.IndexFunc(v, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r)
	}) >= 0 {
		return strconv.Quote(v)
	}
	return v
}

func (r leaseResult) table(now time.Time) ([]string, [][]string) {
	if !r.BackendTime.IsZero() {
		now = r.BackendTime.Time()
	}
	return leaseColumns, [][]string{leaseRow(r.Lease, now)}
}

func (r leaseResult) nextPageToken() string { return "" }

func (r listResult) table(now time.Time) ([]string, [][]string) {
	if !r.BackendTime.IsZero() {
		now = r.BackendTime.Time()
	}
	rows := make([][]string, 0, len(r.Leases))
	for _, rec := range r.Leases {
		rows = append(rows, leaseRow(rec, now))
	}
	return leaseColumns, rows
}

func (r listResult) nextPageToken() string { return r.NextPageToken }

func (r historyResult) table(time.Time) ([]string, [][]string) {
	rows := make([][]string, 0, len(r.Entries))
	for _, h := range r.Entries {
		rec := h.Record
		rows = append(rows, []string{timeCell(h.EndedAt), cell(string(rec.State)), cell(rec.LeaseID),
			strconv.FormatUint(rec.FencingToken, 10), cell(rec.TenantID), cell(rec.ProgramID), cell(rec.TargetNamespace),
			cell(rec.TargetID), cell(rec.ActorName), cell(rec.WorkflowName), cell(rec.OperationClass),
			timeCell(rec.AcquiredAt), cell(h.IncidentID), cell(h.Reason)})
	}
	return historyColumns, rows
}

func (r historyResult) nextPageToken() string { return r.NextPageToken }

// writeTable writes t as aligned columns (two spaces between them), then,
// when there is a next page, a blank line and "next_page_token: TOKEN".
func writeTable(w io.Writer, t tabular, now time.Time) error {
	header, rows := t.table(now)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if tok := t.nextPageToken(); tok != "" {
		_, err := fmt.Fprintf(w, "\nnext_page_token: %s\n", cell(tok))
		return err
	}
	return nil
}
