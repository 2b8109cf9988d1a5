package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/starintel/starlease/lease"
	"github.com/starintel/starlease/wire"
)

// BenchmarkAcquireRelease compares acquire+release pairs over HTTP on
// loopback (the real handler, authentication, service policy and audit)
// with the same pairs called on the store directly, in one run, with 1 and
// 64 concurrent clients, each on its own identity. It reports pairs/s and
// the p50 and p99 latency of a pair.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("store/clients=%d", clients), func(b *testing.B) {
			s := newTestServer(b)
			runPairs(b, clients, func(ctx context.Context, g, i int) error {
				id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "web",
					TargetID: fmt.Sprintf("t-%d", g), ActorName: "crawler"}
				caller := lease.Caller{PrincipalID: "prn-bench", ClientID: "prn-bench", CredentialID: "key-1"}
				deadline := time.Now().Add(5 * time.Second)
				got, err := s.svc.Store().Acquire(ctx, lease.AcquireRequest{Identity: id, ServiceInstanceID: "inst-1",
					TTL: 30 * time.Second, MaximumLifetime: time.Hour, ExecutionID: "exec-1", JobID: "job-1",
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("a-%d-%d", g, i), DeadlineAt: deadline, Caller: caller}})
				if err != nil {
					return err
				}
				_, err = s.svc.Store().Release(ctx, lease.ReleaseRequest{Identity: id, LeaseID: got.Lease.LeaseID,
					FencingToken: got.Lease.FencingToken, ServiceInstanceID: "inst-1",
					Mutation: lease.Mutation{RequestID: fmt.Sprintf("r-%d-%d", g, i), DeadlineAt: deadline, Caller: caller}})
				return err
			})
		})
		b.Run(fmt.Sprintf("http/clients=%d", clients), func(b *testing.B) {
			s := newTestServer(b)
			srv := httptest.NewServer(s)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
			runPairs(b, clients, func(ctx context.Context, g, i int) error {
				id := map[string]string{"tenant_id": "tenant-main", "program_id": "program-a",
					"target_namespace": "web", "target_id": fmt.Sprintf("t-%d", g), "actor_name": "crawler"}
				var acq struct {
					Lease wire.Lease `json:"lease"`
				}
				if err := post(client, srv.URL+Base+"/acquire", s.key, acquireBodyFor(id, fmt.Sprintf("a-%d-%d", g, i)), &acq); err != nil {
					return err
				}
				return post(client, srv.URL+Base+"/"+acq.Lease.LeaseID+"/release", s.key, map[string]any{
					"lock_identity": id, "fencing_token": acq.Lease.FencingToken, "service_instance_id": "inst-1",
					"request_id": fmt.Sprintf("r-%d-%d", g, i)}, nil)
			})
		})
	}
}

func post(c *http.Client, url, key string, body, out any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %d %s", url, resp.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// runPairs runs b.N pairs across clients goroutines and reports pairs/s
// and latency percentiles.
func runPairs(b *testing.B, clients int, pair func(ctx context.Context, g, i int) error) {
	ctx := context.Background()
	var next atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				t0 := time.Now()
				if err := pair(ctx, g, int(i)); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}
