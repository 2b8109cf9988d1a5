package lease

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestCanonicalEncoderMatchesJSON: the appenders write, for any record,
// history entry and evidence, exactly the bytes encoding/json writes —
// the stored format does not change with the encoder, including strings
// that need escaping (quotes, controls, HTML characters, U+2028, invalid
// UTF-8), empty and nil metadata, omitted history fields and a nil lease.
func TestCanonicalEncoderMatchesJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"", "a", "tenant-1", "ünïcödé", `quote "`, `back\slash`, "<tag>", "a&b", "\u2028", "\u2029",
		"\x00", "\t\n", "\x7f", "\xff\xfe", "日本", "😀", "lease_01J0000000000000000000000", "x:y.z_w-v"}
	str := func() string {
		var b []byte
		for n := rng.IntN(4); n > 0; n-- {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		return string(b)
	}
	ts := func() Timestamp {
		return UnixMilli(rng.Int64N(253402300799999))
	}
	record := func() *Record {
		r := &Record{RecordVersion: rng.IntN(3), LockKey: str(), TenantID: str(), ProgramID: str(), TargetNamespace: str(),
			TargetID: str(), ActorName: str(), WorkflowName: str(), OperationClass: str(), LeaseID: str(),
			OwnerPrincipalID: str(), OwnerClientID: str(), OwnerCredentialID: str(), ServiceInstanceID: str(),
			FencingToken: rng.Uint64(), AcquiredAt: ts(), RenewedAt: ts(), ExpiresAt: ts(), TTLMs: rng.Int64() - rng.Int64(),
			MaximumLifetimeMs: rng.Int64(), ExecutionID: str(), JobID: str(), TraceID: str(), RequestID: str(),
			State: State(str())}
		switch rng.IntN(3) {
		case 0:
		case 1:
			r.Metadata = Metadata{}
		default:
			r.Metadata = Metadata{str(): str(), "n": rng.Float64() * 1e6, "ok": true, "nothing": nil, "i": float64(rng.IntN(100))}
		}
		return r
	}
	same := func(what string, got []byte, err error, v any) {
		t.Helper()
		want, werr := json.Marshal(v)
		if err != nil || werr != nil {
			t.Fatalf("%s: appender %v, json %v", what, err, werr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs:\n got %s\nwant %s", what, got, want)
		}
	}
	for i := 0; i < 3000; i++ {
		r := record()
		b, err := appendRecord(nil, r)
		same("record", b, err, r)
		h := &HistoryEntry{HistoryVersion: rng.IntN(3), Record: r, EndedAt: ts()}
		if rng.IntN(2) == 0 {
			h.EndedBy, h.RequestID, h.Reason, h.IncidentID = str(), str(), str(), str()
		}
		if rng.IntN(10) == 0 {
			h.Record = nil
		}
		b, err = appendHistoryEntry(nil, h)
		same("history entry", b, err, h)
		e := &IdempotencyRecord{Version: rng.IntN(3), Op: Op(str()), Digest: str(), Code: Code(str()), Lease: r, BackendTime: ts()}
		if rng.IntN(10) == 0 {
			e.Lease = nil
		}
		b, err = appendIdempotencyRecord(nil, e)
		same("evidence", b, err, e)
	}
	// A zero timestamp fails as it does through encoding/json.
	r := record()
	r.ExpiresAt = Timestamp{}
	if _, err := appendRecord(nil, r); err == nil {
		t.Fatal("a record with a zero timestamp encoded")
	}
	if _, err := json.Marshal(r); err == nil {
		t.Fatal("encoding/json encoded a zero timestamp")
	}
}

func BenchmarkEncodeRecord(b *testing.B) {
	r := &Record{RecordVersion: 1, LockKey: "lk", TenantID: "tenant-1", ProgramID: "program-1", TargetNamespace: "starintel-target",
		TargetID: "example.com", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default",
		LeaseID: "lease_01J0000000000000000000000", OwnerPrincipalID: "prn_1", OwnerClientID: "client_1",
		OwnerCredentialID: "key_1", ServiceInstanceID: "instance_1", FencingToken: 42, AcquiredAt: UnixMilli(1e12),
		RenewedAt: UnixMilli(1e12), ExpiresAt: UnixMilli(1e12 + 30000), TTLMs: 30000, MaximumLifetimeMs: 300000,
		ExecutionID: "execution_1", JobID: "job_1", TraceID: "trace_1", RequestID: "req_1", State: StateActive}
	h := &HistoryEntry{HistoryVersion: 1, Record: r, EndedAt: UnixMilli(1e12 + 1000), EndedBy: "prn_1", RequestID: "req_2"}
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("appender", func(b *testing.B) {
		for b.Loop() {
			if _, err := appendHistoryEntry(make([]byte, 0, 1280), h); err != nil {
				b.Fatal(err)
			}
		}
	})
}
