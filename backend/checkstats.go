package backend

import (
	"sync"
	"sync/atomic"
	"time"
)

// CheckBuckets are the upper bounds, in seconds, of the check duration
// histogram: from a loopback connect to a check near its timeout.
var CheckBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// checkStats counts a backend's active check results and their durations.
type checkStats struct {
	buckets [14]atomic.Uint64 // per CheckBuckets bound, and one for +Inf; not cumulative
	sumNano atomic.Int64
	ok      atomic.Uint64
	failed  atomic.Uint64

	mu   sync.Mutex // protects last
	last CheckResult
}

// CheckResult is one active check's outcome.
type CheckResult struct {
	At      time.Time     // when it started; zero: no check has run
	Latency time.Duration // how long it took
	Err     string        // why it failed; "" when it passed
}

// CheckStats is a copy of a backend's check counters: a histogram of
// durations (Counts[i] checks took at most CheckBuckets[i] seconds,
// cumulative; Count in all) and the results.
type CheckStats struct {
	Counts     []uint64 // cumulative, one per CheckBuckets bound
	Count      uint64
	SumSeconds float64
	OK, Failed uint64
	Last       CheckResult
}

func (c *checkStats) record(start time.Time, d time.Duration, err error) {
	i := 0
	for i < len(CheckBuckets) && d.Seconds() > CheckBuckets[i] {
		i++
	}
	c.buckets[i].Add(1)
	c.sumNano.Add(int64(d))
	r := CheckResult{At: start, Latency: d}
	if err != nil {
		c.failed.Add(1)
		r.Err = err.Error()
	} else {
		c.ok.Add(1)
	}
	c.mu.Lock()
	c.last = r
	c.mu.Unlock()
}

// recordLocal keeps a probe that failed for want of fulcrum's own resources
// as the last result, saying it was not counted, without counting it.
func (c *checkStats) recordLocal(start time.Time, d time.Duration, err error) {
	c.mu.Lock()
	c.last = CheckResult{At: start, Latency: d, Err: "not counted, fulcrum's own resources: " + err.Error()}
	c.mu.Unlock()
}

// Checks returns the backend's check counters and its last result.
func (b *Backend) Checks() CheckStats {
	c := &b.checks
	s := CheckStats{Counts: make([]uint64, len(CheckBuckets)), SumSeconds: time.Duration(c.sumNano.Load()).Seconds(),
		OK: c.ok.Load(), Failed: c.failed.Load()}
	var n uint64
	for i := range CheckBuckets {
		n += c.buckets[i].Load()
		s.Counts[i] = n
	}
	s.Count = n + c.buckets[len(CheckBuckets)].Load()
	c.mu.Lock()
	s.Last = c.last
	c.mu.Unlock()
	return s
}
