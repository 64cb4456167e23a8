package listener

import (
	"sync"
	"sync/atomic"
	"time"
)

// holdQueue is a service's hold_timeout queue: connections for which no
// backend is eligible, waiting for the next snapshot (Publish) or a
// passing check (Kick), in arrival order.
type holdQueue struct {
	mu sync.Mutex      // protects q
	q  []chan struct{} // one per waiting connection, oldest first; closed by kick

	holding atomic.Int64  // len(q), read without the lock
	held    atomic.Uint64 // connections that had to wait
	expired atomic.Uint64 // connections whose hold_timeout ran out
}

// hold is one connection's place in the hold queue.
type hold struct {
	a  *admission
	ch chan struct{}
}

// join joins the hold queue. The caller checks the current snapshot once
// more after joining (one published just before would otherwise be
// missed), then waits, and finally leaves.
func (a *admission) join() *hold {
	h := &hold{a: a, ch: make(chan struct{})}
	a.hold.mu.Lock()
	a.hold.q = append(a.hold.q, h.ch)
	a.hold.holding.Add(1)
	a.hold.mu.Unlock()
	return h
}

// wait blocks until the next kick or the deadline, and reports false at
// the deadline.
func (h *hold) wait(deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-h.ch:
		return true
	case <-t.C:
		return false
	}
}

// leave leaves the queue, if a kick has not already emptied it.
func (h *hold) leave() {
	select {
	case <-h.ch:
		return // kicked: kick took it out of the queue already
	default:
	}
	q := &h.a.hold
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

// kick wakes every waiting connection, oldest first, to look at the
// current snapshot. It costs one atomic load when nobody waits.
func (a *admission) kick() {
	if a.hold.holding.Load() == 0 {
		return
	}
	a.hold.mu.Lock()
	q := a.hold.q
	a.hold.q = nil
	a.hold.holding.Add(-int64(len(q)))
	a.hold.mu.Unlock()
	for _, ch := range q {
		close(ch)
	}
}
