package rabbitmq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/starintel/starlease/internal/testenv"
	"github.com/starintel/starlease/lease"
)

// TestOutboxReturnsExactAcceptanceOrder: the relay publishes in the order
// the outbox returns (Relay doc), and the Deduper relies on it to keep the
// later write of a lease last. So the outbox must return exactly the
// acceptance order (a lease's commit_seq order), even for publications
// accepted concurrently within the same millisecond: Valkey scores its
// outbox by a namespace sequence incremented in the commit function's
// atomic step (not by accepted_at, whose ties came back in message-id
// order), bolt keys it by the bucket sequence taken in the commit's
// transaction. (bolt's test clock stands still, so every entry there has
// the same accepted_at.)
func TestOutboxReturnsExactAcceptanceOrder(t *testing.T) {
	redis := testenv.StartRedis(t)
	for _, b := range []backend{boltBackend(), valkeyBackend(redis)} {
		t.Run(b.name, func(t *testing.T) {
			e := b.env(t, nil)
			rec := e.acquire("writer")
			pub := e.publisher()
			c := e.committer(rec)
			seqOf := map[string]uint64{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; i < 12; i++ {
						p, err := pub.Publish(context.Background(), c, fmt.Sprintf("c-%d-%d", w, i), lease.OutboxMessage{RoutingKey: "q", Body: []byte("x")})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						seqOf[p.MessageID] = p.Guard.CommitSeq
						mu.Unlock()
					}
				}(w)
			}
			wg.Wait()
			got := e.pending()
			if len(got) != len(seqOf) {
				t.Fatalf("outbox holds %d entries, want %d", len(got), len(seqOf))
			}
			inversions := 0
			for i := 1; i < len(got); i++ {
				if seqOf[got[i].MessageID] < seqOf[got[i-1].MessageID] {
					inversions++
					if inversions == 1 {
						t.Errorf("outbox returns commit_seq %d (accepted_at %v) after commit_seq %d (accepted_at %v)",
							seqOf[got[i].MessageID], got[i].AcceptedAt, seqOf[got[i-1].MessageID], got[i-1].AcceptedAt)
					}
				}
			}
			if inversions > 0 {
				t.Errorf("%d of %d outbox entries are out of acceptance order", inversions, len(got))
			}
		})
	}
}
