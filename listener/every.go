package listener

import (
	"sync/atomic"
	"time"
)

// every lets a log line of one kind through at most once an interval (a
// second when Interval is 0) and counts the ones it held back, which the
// next line let through reports: a flood costs a line a second, and the
// operator still sees its size. Every event of the kind goes through
// Allow. The connection limit's lines and every rejection's use it; the
// zero value is ready.
type every struct {
	Interval time.Duration
	last     atomic.Int64  // unix nanoseconds of the last line let through
	held     atomic.Uint64 // lines held back since
}

// Allow reports whether a line may be written now, and if so how many were
// held back since the last one (the line's "suppressed").
func (e *every) Allow() (suppressed uint64, ok bool) {
	iv := e.Interval
	if iv <= 0 {
		iv = time.Second
	}
	now, last := time.Now().UnixNano(), e.last.Load()
	if last != 0 && now-last < int64(iv) || !e.last.CompareAndSwap(last, now) {
		e.held.Add(1)
		return 0, false
	}
	return e.held.Swap(0), true
}
