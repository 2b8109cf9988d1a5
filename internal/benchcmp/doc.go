// Package benchcmp holds the side-by-side benchmark `make bench` runs:
// starlease's stores next to the locks users would otherwise pick (etcd's
// concurrency.Mutex, bsm/redislock) and the bare floors of each server,
// measured in one process, one run, interleaved, so the ratios between
// rows are what the comparison claims and the machine's drift cancels.
// It has no code outside its benchmark.
package benchcmp
