package backend

import (
	"sync"
	"sync/atomic"
	"time"
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
}

func newGroup(service string) *Group {
	return &Group{Service: service, wake: make(chan struct{})}
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
