package valkey

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/starintel/starlease/lease"
)

// The record memo answers exactly as lease.DecodeRecord, hands out copies
// and stays bounded.
func TestRecordMemo(t *testing.T) {
	id := newIdentity()
	a := acquireReq(id)
	rec := &lease.Record{RecordVersion: 1, LockKey: lockKey(t, id), LeaseID: "lease_01", OwnerPrincipalID: "prn_1",
		OwnerClientID: "client_1", OwnerCredentialID: "key_1", ServiceInstanceID: "instance_1", FencingToken: 7,
		AcquiredAt: lease.UnixMilli(1_700_000_000_000), RenewedAt: lease.UnixMilli(1_700_000_000_000),
		ExpiresAt: lease.UnixMilli(1_700_000_030_000), TTLMs: 30000, MaximumLifetimeMs: 300000,
		ExecutionID: a.ExecutionID, JobID: a.JobID, TraceID: a.TraceID, RequestID: a.RequestID,
		Metadata: lease.Metadata{"k": "v"}, State: lease.StateActive}
	rec.SetIdentity(id)
	raw, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var mm recordMemo
	want, _ := lease.DecodeRecord(raw)
	first, err := mm.decode(raw)
	if err != nil || !reflect.DeepEqual(first, want) {
		t.Fatalf("first decode: %v %+v", err, first)
	}
	first.Metadata["k"] = "changed"
	first.State = lease.StateReleased
	second, err := mm.decode(raw)
	if err != nil || !reflect.DeepEqual(second, want) {
		t.Fatalf("a hit differs from DecodeRecord (or a caller's change leaked): %v %+v", err, second)
	}
	bad := append(append([]byte{}, raw...), 'x')
	for i := 0; i < 2; i++ {
		if _, err := mm.decode(bad); lease.CodeOf(err) != lease.CodeCorrupt {
			t.Fatalf("trailing data: %v", err)
		}
	}
	for i := 0; i < recordMemoMax+10; i++ {
		c := rec.Clone()
		c.FencingToken = uint64(i + 1)
		b, err := c.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := mm.decode(b); err != nil || got.FencingToken != uint64(i+1) {
			t.Fatalf("record %s: %v", strconv.Itoa(i), err)
		}
	}
	if n := len(mm.m); n > recordMemoMax {
		t.Fatalf("memo holds %d entries, bound %d", n, recordMemoMax)
	}
}
