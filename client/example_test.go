package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/starintel/starlease/client"
	"github.com/starintel/starlease/lease"
)

// Acquire a lease, renew it, and release it; resolve an outcome-unknown
// answer by retrying with the same request id.
func Example() {
	c, err := client.New("http://127.0.0.1:8080", "star_sk_v1_…", client.WithTimeout(5*time.Second))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-1", ActorName: "usernamegen"}
	req := client.AcquireRequest{LockIdentity: id, TTLMs: 30000, ServiceInstanceID: "instance-1",
		ExecutionID: "execution-1", JobID: "job-1", RequestID: client.NewRequestID()}
	res, err := c.Acquire(ctx, req)
	for lease.CodeOf(err) == lease.CodeOutcomeUnknown {
		res, err = c.Acquire(ctx, req) // same request id: the stored result, or the one acquisition
	}
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == lease.CodeConflict {
		fmt.Println("held by someone else; retry after", ce.RetryAfter)
		return
	}
	if err != nil {
		panic(err)
	}
	l := res.Lease
	if _, err := c.Renew(ctx, client.RenewRequest{LeaseID: l.LeaseID, LockIdentity: id,
		FencingToken: l.FencingToken, ServiceInstanceID: "instance-1"}); lease.CodeOf(err) == lease.CodeLost {
		fmt.Println("lease lost: stop the work")
		return
	}
	_, _ = c.Release(ctx, client.ReleaseRequest{LeaseID: l.LeaseID, LockIdentity: id,
		FencingToken: l.FencingToken, ServiceInstanceID: "instance-1"})
}
