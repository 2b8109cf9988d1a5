package executor

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starintel/starlease/bolt"
	"github.com/starintel/starlease/lease"
)

// An attack review: a renewal whose reply is lost is retried with the same request id; if
// an administrator revoked the lease in between, the replay now says so
// (Result.Current revoked). The executor, which resolves exactly this
// unknown outcome, must not count it a renewal and extend its local
// expiry: the lease is gone and the work must be cancelled now.
func TestReplayedRenewalOfRevokedLeaseCancelsTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := openStore(t, bolt.Options{})
		sp := &spy{LeaseAPI: store}
		var sawCurrent *lease.Record
		sp.renew = func(ctx context.Context, req lease.RenewRequest, n int) (lease.Result, error) {
			res, err := store.Renew(ctx, req)
			if n == 1 {
				if err != nil {
					t.Errorf("first renewal: %v", err)
				} else if _, rerr := store.Revoke(context.Background(), adminRequest(res.Lease)); rerr != nil {
					t.Errorf("revoke: %v", rerr)
				}
				return lease.Result{}, &lease.Error{Code: lease.CodeOutcomeUnknown, Reason: "timeout after submission"}
			}
			if n == 2 {
				sawCurrent = res.Current
			}
			return res, err
		}
		var renewedWhileRevoked bool
		var cause error
		_ = Run(context.Background(), sp, specFor(t, "instance-a"), func(ctx context.Context, l *Lease) error {
			for l.Renewals() == 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			renewedWhileRevoked = ctx.Err() == nil && l.Renewals() > 0
			cause = context.Cause(ctx)
			if renewedWhileRevoked {
				t.Logf("executor counted the replay a renewal; local expiry now %s; lease cancelled? %v",
					l.LocalExpiry(), ctx.Err())
			}
			return nil
		})
		if sawCurrent == nil || sawCurrent.State != lease.StateRevoked {
			t.Fatalf("the store's replay did not report the revoked state: %+v", sawCurrent)
		}
		if renewedWhileRevoked {
			t.Fatalf("executor treated the replay of a renewal of a revoked lease (current %s) as renewed; the work was not cancelled",
				sawCurrent.State)
		}
		if !errors.Is(cause, ErrRevoked) {
			t.Fatalf("the work was cancelled with %v, want the cause ErrRevoked", cause)
		}
	})
}
