package backend

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Group is the live state the backends of one service share, kept across
// reloads like the backends themselves: the service's connection count (for
// its max_conns), its wait queue, and service-level counters.
//
// Typical use, per connection:
//
//	if !g.Acquire(maxConns) { ... queue with g.Wait, or refuse }
//	defer g.Release()
type Group struct {
	Service string

	active  atomic.Int64  // connections holding a service slot
	waiting atomic.Int64  // connections in the queue now
	retries atomic.Uint64 // dials tried after a failed one
	queued  atomic.Uint64 // connections that had to wait
	refused atomic.Uint64 // connections closed for want of a slot (at once, or when their wait ran out)

	mu   sync.Mutex    // protects wake
	wake chan struct{} // closed, and replaced, when a slot frees while someone waits

	limits limits
}

func newGroup(service string) *Group {
	g := &Group{Service: service, wake: make(chan struct{})}
	g.limits.logEvery.Interval = time.Second
	return g
}

// Acquire takes a service slot; with max > 0 it fails when max are taken.
func (g *Group) Acquire(max int) bool {
	if max <= 0 {
		g.active.Add(1)
		return true
	}
	for {
		n := g.active.Load()
		if n >= int64(max) {
			return false
		}
		if g.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release returns a service slot, waking the queue.
func (g *Group) Release() {
	g.active.Add(-1)
	g.freed()
}

// freed wakes every waiter: a service or backend slot is free. It costs one
// atomic load when nobody waits.
func (g *Group) freed() {
	if g.waiting.Load() == 0 {
		return
	}
	g.mu.Lock()
	close(g.wake)
	g.wake = make(chan struct{})
	g.mu.Unlock()
}

// Waiter is one connection's place in the queue.
type Waiter struct {
	g    *Group
	done bool
}

// Enqueue joins the queue. The caller must try again once after Enqueue
// (a slot freed just before would otherwise be missed), then Wait, and
// finally Leave.
func (g *Group) Enqueue() *Waiter {
	g.waiting.Add(1)
	g.queued.Add(1)
	return &Waiter{g: g}
}

// Wait blocks until a slot may have freed or until deadline, and reports
// false at the deadline. Take the wake channel before the retry that
// follows Enqueue: Wake returns it.
func (w *Waiter) Wait(wake <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return false
	}
}

// Wake returns the channel the next freed slot closes.
func (g *Group) Wake() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wake
}

// Leave leaves the queue.
func (w *Waiter) Leave() {
	if !w.done {
		w.done = true
		w.g.waiting.Add(-1)
	}
}

// Retried counts a dial tried after a failed one.
func (g *Group) Retried() { g.retries.Add(1) }

// Refused counts a connection closed for want of a slot.
func (g *Group) Refused() { g.refused.Add(1) }

// GroupStats is a copy of a group's counters.
type GroupStats struct {
	Active  int64
	Waiting int64
	Retries uint64
	Queued  uint64
	Refused uint64
}

// Stats reads the counters.
func (g *Group) Stats() GroupStats {
	return GroupStats{Active: g.active.Load(), Waiting: g.waiting.Load(), Retries: g.retries.Load(),
		Queued: g.queued.Load(), Refused: g.refused.Load()}
}

// Why connections were turned away before any backend was dialled.
const (
	RejectDenied    = iota // allow/deny lists
	RejectRate             // accept_rate
	RejectPerSource        // max_conns_per_source
	RejectProxy            // a missing, malformed or untrusted PROXY header
	rejectKinds
)

// RejectNames names the Reject kinds, for logs and metrics.
var RejectNames = [rejectKinds]string{"denied", "rate", "per_source", "proxy"}

// limits are the per-service admission controls that survive reloads.
type limits struct {
	rejected [rejectKinds]atomic.Uint64
	limiter  atomic.Pointer[rate.Limiter] // nil: no accept_rate
	logEvery rate.Sometimes               // rejection log lines, at most one a second

	srcMu sync.Mutex // protects sources
	srcs  map[netip.Addr]int
}

// SetRate sets the service's accept_rate (connections per second, with a
// bucket of burst); 0 removes it. An unchanged rate keeps its bucket.
func (g *Group) SetRate(perSecond float64, burst int) {
	if perSecond <= 0 {
		g.limits.limiter.Store(nil)
		return
	}
	if burst <= 0 {
		burst = max(1, int(perSecond))
	}
	if l := g.limits.limiter.Load(); l != nil && l.Limit() == rate.Limit(perSecond) && l.Burst() == burst {
		return
	}
	g.limits.limiter.Store(rate.NewLimiter(rate.Limit(perSecond), burst))
}

// Rate returns the accept_rate in force: connections per second and the
// bucket's size; 0, 0 when there is none.
func (g *Group) Rate() (perSecond float64, burst int) {
	if l := g.limits.limiter.Load(); l != nil {
		return float64(l.Limit()), l.Burst()
	}
	return 0, 0
}

// AllowAccept takes a token from the accept_rate bucket.
func (g *Group) AllowAccept() bool {
	l := g.limits.limiter.Load()
	return l == nil || l.Allow()
}

// AcquireSource takes one of max slots for client address a; max <= 0 is
// unlimited (and takes nothing).
func (g *Group) AcquireSource(a netip.Addr, max int) bool {
	if max <= 0 {
		return true
	}
	g.limits.srcMu.Lock()
	defer g.limits.srcMu.Unlock()
	if g.limits.srcs == nil {
		g.limits.srcs = map[netip.Addr]int{}
	}
	if g.limits.srcs[a] >= max {
		return false
	}
	g.limits.srcs[a]++
	return true
}

// ReleaseSource returns a slot taken by AcquireSource with the same max.
func (g *Group) ReleaseSource(a netip.Addr, max int) {
	if max <= 0 {
		return
	}
	g.limits.srcMu.Lock()
	defer g.limits.srcMu.Unlock()
	if n := g.limits.srcs[a] - 1; n > 0 {
		g.limits.srcs[a] = n
	} else {
		delete(g.limits.srcs, a)
	}
}

// Reject counts a connection turned away for reason kind, and runs log at
// most once a second per service (so a flood does not flood the log).
func (g *Group) Reject(kind int, log func(total uint64)) {
	n := g.limits.rejected[kind].Add(1)
	g.limits.logEvery.Do(func() { log(n) })
}

// Rejected returns the counts of connections turned away, by kind.
func (g *Group) Rejected() [rejectKinds]uint64 {
	var out [rejectKinds]uint64
	for i := range out {
		out[i] = g.limits.rejected[i].Load()
	}
	return out
}
