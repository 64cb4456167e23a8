package backend

import (
	"sync"
	"sync/atomic"
	"time"
)

// holdQueue is a service's hold_timeout queue: connections for which no
// backend is eligible, waiting for the next table in arrival order.
type holdQueue struct {
	mu sync.Mutex      // protects q
	q  []chan struct{} // one per waiting connection, oldest first; closed by Kick

	holding atomic.Int64  // len(q), read without the lock
	held    atomic.Uint64 // connections that had to wait
	expired atomic.Uint64 // connections whose hold_timeout ran out
}

// Hold is one connection's place in the hold queue.
type Hold struct {
	g  *Group
	ch chan struct{}
}

// Hold joins the queue. The caller checks the current table once more
// after joining (a table swapped in just before would otherwise be
// missed), then Waits, and finally Leaves.
func (g *Group) Hold() *Hold {
	h := &Hold{g: g, ch: make(chan struct{})}
	g.hold.mu.Lock()
	g.hold.q = append(g.hold.q, h.ch)
	g.hold.holding.Add(1)
	g.hold.mu.Unlock()
	return h
}

// HoldBegan counts a connection that starts to wait for an eligible
// backend (once per connection, however often it re-joins).
func (g *Group) HoldBegan() { g.hold.held.Add(1) }

// HoldExpired counts a connection whose hold_timeout ran out.
func (g *Group) HoldExpired() { g.hold.expired.Add(1) }

// Wait blocks until the next Kick or the deadline, and reports false at
// the deadline.
func (h *Hold) Wait(deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-h.ch:
		return true
	case <-t.C:
		return false
	}
}

// Leave leaves the queue, if a Kick has not already emptied it.
func (h *Hold) Leave() {
	select {
	case <-h.ch:
		return // kicked: Kick took it out of the queue already
	default:
	}
	q := &h.g.hold
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, ch := range q.q {
		if ch == h.ch {
			q.q = append(q.q[:i], q.q[i+1:]...)
			q.holding.Add(-1)
			return
		}
	}
}

// Kick wakes every waiting connection, oldest first, to look at a new
// table: the reload path calls it after each swap. It costs one atomic load
// when nobody waits.
func (g *Group) Kick() {
	if g.hold.holding.Load() == 0 {
		return
	}
	g.hold.mu.Lock()
	q := g.hold.q
	g.hold.q = nil
	g.hold.holding.Add(-int64(len(q)))
	g.hold.mu.Unlock()
	for _, ch := range q {
		close(ch)
	}
}

// HoldStats is a copy of a group's hold counters.
type HoldStats struct {
	Holding int64  // waiting now
	Held    uint64 // connections that had to wait
	Expired uint64 // of those, the ones whose hold_timeout ran out
}

// HoldStats reads the hold counters.
func (g *Group) HoldStats() HoldStats {
	return HoldStats{Holding: g.hold.holding.Load(), Held: g.hold.held.Load(), Expired: g.hold.expired.Load()}
}
