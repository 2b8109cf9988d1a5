package bolt

import bbolt "go.etcd.io/bbolt"

// bucketFill is how full bbolt leaves the first node of a split in one
// bucket (Bucket.FillPercent, which lasts for the transaction only).
type bucketFill struct {
	bucket []byte
	fill   float64
}

// storeFills are the store's buckets whose keys arrive in nearly
// increasing order: times (backend time is monotonic), sequences, lease
// ids (a time prefix), or a few such streams (the List index, by owner
// and program). At bbolt's default of one half, a node split by appending
// stays half empty for good (measured 0.50 fill in each of these), so
// they are split full, or at nine tenths where keys also land in the
// middle (expiry times of leases of different TTLs, the index's targets,
// dead letters of older entries).
//
// A full split keeps a full page and moves the rest to a new leaf, which
// fills only if later keys land in its range: where many keys arrive
// behind the head, that leaves a trail of small leaves. So history_exp,
// whose entries the reaper writes at the expiry time, up to a reap
// interval back, splits at three quarters (review measured 0.33 fill at
// 1, 0.74 at 0.75, 0.73 at the default). The leases bucket splits at
// eight tenths: its entries grow by about a seventh in place when a lease
// ends, and a node split full then splits again on each such update
// (measured 0.21 fill). Not the ident bucket: random lock keys.
//
// FillPercent also sets when bbolt merges a node after deletes (below
// half of it): a little more merging at the oldest end of these buckets,
// which measured no difference in pages written.
var storeFills = []bucketFill{
	{bucketIdemExp, 1}, {bucketCommitExp, 1}, {bucketOutbox, 1},
	{bucketActiveExp, 0.9}, {bucketIndex, 0.9}, {bucketOutboxDead, 0.9},
	{bucketLeases, 0.8}, {bucketHistoryExp, 0.75},
}

// auditFills: an event's id is made when its operation starts and the
// event is written when it ends, so ids arrive out of order by the
// operations' latencies; at three quarters the events bucket stays 0.65
// to 0.73 full under that (review measured 0.44 to 0.51 at 1 and 0.46 to
// 0.63 at the default, with 0 to 20 ms of latency at 32 goroutines).
var auditFills = []bucketFill{{auditBucketEvents, 0.75}}

// setFills applies fills to tx's bucket handles, which tx reuses for the
// rest of the transaction.
func setFills(tx *bbolt.Tx, fills []bucketFill) {
	for _, f := range fills {
		if b := tx.Bucket(f.bucket); b != nil {
			b.FillPercent = f.fill
		}
	}
}
