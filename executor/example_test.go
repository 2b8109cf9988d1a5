package executor_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/executor"
	"github.com/starintel/starlease/fence"
	"github.com/starintel/starlease/fence/fencetest"
	"github.com/starintel/starlease/lease"
)

// A leased actor: it holds the target's lease while it works (the executor
// renews it in the background), commits its result through the lease's
// fenced committer, and releases the lease when it returns.
func Example() {
	// The embedded lease store. A deployed actor talks to the starlease
	// server instead, through an adapter over package client.
	dir, err := os.MkdirTemp("", "starlease-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := bolt.Open(filepath.Join(dir, "lease.db"), bolt.Options{ReapInterval: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// Where results land. In StarIntel this is the fenced CouchDB writer; any
	// fence.Sink conditions its write on the commit's guard.
	results := fencetest.NewMemorySink("scan-results")

	spec := executor.Spec{
		Identity: lease.Identity{TenantID: "acme", ProgramID: "recon", TargetNamespace: "web",
			TargetID: "example.com", ActorName: "portscan"},
		ServiceInstanceID: "instance-1",
		ExecutionID:       "exec-42",
		JobID:             "job-7",
		TraceID:           "trace-9",
		Caller:            lease.Caller{PrincipalID: "prn-portscan", ClientID: "client-1", CredentialID: "key-1"},
		TTL:               2 * time.Second, // renewed about every 1.3 s
		Logger:            slog.New(slog.DiscardHandler),
	}

	var leaseID string
	err = executor.Run(context.Background(), store, spec, func(ctx context.Context, l *executor.Lease) error {
		leaseID = l.LeaseID()
		fmt.Println("acquired with fencing token", l.FencingToken())
		var open []int
		for _, port := range []int{22, 80, 443} {
			select {
			case <-ctx.Done():
				// The lease is lost (context.Cause says why): stop. Even if
				// we went on, no commit of ours would be accepted.
				return context.Cause(ctx)
			case <-time.After(500 * time.Millisecond): // probing the port
			}
			open = append(open, port)
		}
		// The commit id names this commit; a retry with the same id is safe.
		g, err := fence.Write(ctx, l.Committer(), results, "exec-42-result",
			fencetest.Doc{ID: "example.com", Body: fmt.Sprint("open ports ", open)})
		if err != nil {
			return err // lease_lost, commit_rejected, outcome_unknown…
		}
		fmt.Println("renewed while working:", l.Renewals() > 0)
		fmt.Println("result accepted under token", g.FencingToken)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	doc, _ := results.Get("example.com")
	fmt.Printf("stored: %s (token %d, lease %v)\n", doc.Body, doc.Guard.FencingToken, doc.Guard.LeaseID == leaseID)
	res, err := store.Inspect(context.Background(), lease.InspectRequest{LeaseID: leaseID, DeadlineAt: time.Now().Add(time.Second)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lease after Run:", res.Lease.State)
	// Output:
	// acquired with fencing token 1
	// renewed while working: true
	// result accepted under token 1
	// stored: open ports [22 80 443] (token 1, lease true)
	// lease after Run: released
}
