package health

import (
	"sort"
	"sync"
	"time"
)

// WALClock measures how far a PostgreSQL replica is behind its primary, in
// time, from positions in the WAL: the checks of a service's primaries
// record where each was and when (Primary), and a replica's check asks how
// long ago the primary was where the replica has replayed to (Lag). A
// replica whose stream has gone silent while the primary writes falls
// behind by the clock, whatever it last received; a replica of an idle
// primary has everything and lags 0, however old its last transaction.
//
// Positions are compared within one timeline history: a primary on a
// higher timeline (a promotion) starts the clock again, and one on a lower
// timeline (the old side of a split brain) is not recorded. The zero value
// is ready to use; a nil *WALClock records nothing and knows nothing. Safe
// for concurrent use.
type WALClock struct {
	mu       sync.Mutex // protects timeline and marks
	timeline uint64
	marks    []walMark // by increasing position; at most maxWALMarks, oldest dropped first
}

// walMark is one position a primary was seen at, from its first to its
// last check there.
type walMark struct {
	pos         uint64
	first, last time.Time
}

// maxWALMarks bounds a clock: at one check a second, about 17 minutes of
// writes, far above any useful max_lag. A replica behind every mark lags
// at least as long as the oldest one is old.
const maxWALMarks = 1024

// Primary records that a primary on timeline was at WAL position pos at
// (at least) at. A position of 0 (not known) records nothing.
func (c *WALClock) Primary(at time.Time, timeline, pos uint64) {
	if c == nil || pos == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case timeline > c.timeline:
		c.timeline, c.marks = timeline, c.marks[:0]
	case timeline < c.timeline:
		return
	}
	if n := len(c.marks); n > 0 {
		m := &c.marks[n-1]
		if pos < m.pos {
			return // another primary on this timeline, behind the first: the one ahead keeps the clock
		}
		if pos == m.pos {
			if at.After(m.last) {
				m.last = at
			}
			return
		}
	}
	if len(c.marks) == maxWALMarks {
		c.marks = append(c.marks[:0], c.marks[1:]...)
	}
	c.marks = append(c.marks, walMark{pos: pos, first: at, last: at})
}

// Lag returns how far behind the primary a replica that has replayed up to
// pos is at now: 0 when it has all the primary had at its last check, else
// how long ago the primary was at pos (interpolated between the two marks
// around it). known is false while no primary has been recorded, or none
// within fresh: a primary that has not answered for that long (dead, cut
// off) is no measure of what the replica misses, since nothing is written
// meanwhile, and replicas must not all leave the pool because it died.
func (c *WALClock) Lag(now time.Time, pos uint64, fresh time.Duration) (lag time.Duration, known bool) {
	return c.lag(now, pos, fresh, true)
}

// lag is Lag; with behindAll false, a replica behind every mark the clock
// holds is not measured (known is false: see Probe.clockLag).
func (c *WALClock) lag(now time.Time, pos uint64, fresh time.Duration, behindAll bool) (lag time.Duration, known bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.marks)
	if n == 0 || now.Sub(c.marks[n-1].last) > fresh {
		return 0, false
	}
	if pos >= c.marks[n-1].pos {
		return 0, true
	}
	i := sort.Search(n, func(i int) bool { return c.marks[i].pos > pos }) // the first mark ahead of the replica
	if i == 0 {
		if !behindAll {
			return 0, false
		}
		return max(now.Sub(c.marks[0].first), 0), true // behind all the clock knows: at least this
	}
	a, b := c.marks[i-1], c.marks[i]
	// The primary passed pos between a's last check and b's first.
	frac := float64(pos-a.pos) / float64(b.pos-a.pos)
	at := a.last.Add(time.Duration(frac * float64(b.first.Sub(a.last))))
	return max(now.Sub(at), 0), true
}
