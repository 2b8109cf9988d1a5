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
// dead letters of older entries). The leases bucket splits at eight
// tenths: its values grow by about a tenth in place when a lease ends,
// and a node split full then splits again on each such update (measured
// 0.21 fill). Not the ident bucket: random lock keys.
var storeFills = []bucketFill{
	{bucketIdemExp, 1}, {bucketCommitExp, 1}, {bucketHistoryExp, 1}, {bucketOutbox, 1},
	{bucketActiveExp, 0.9}, {bucketIndex, 0.9}, {bucketOutboxDead, 0.9}, {bucketLeases, 0.8},
}

// auditFills: audit event ids increase in the order events are made.
var auditFills = []bucketFill{{auditBucketEvents, 1}}

// setFills applies fills to tx's bucket handles, which tx reuses for the
// rest of the transaction.
func setFills(tx *bbolt.Tx, fills []bucketFill) {
	for _, f := range fills {
		if b := tx.Bucket(f.bucket); b != nil {
			b.FillPercent = f.fill
		}
	}
}
