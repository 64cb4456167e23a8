package listener

// The connections being admitted: accepted, and not yet a session tracked
// by its backend nor ended. A shutdown or a hand-over closes the listening
// sockets first; what was accepted before that is this instance's to serve,
// so the backends' drains (which make Acquire refuse) wait for Admitted.

import (
	"sync"
	"sync/atomic"
)

// admitCount counts the connections in handle. The count is an atomic, so
// that the per-connection path takes no lock; the lock is taken only when
// the count falls to zero, to wake a waiter.
type admitCount struct {
	n    atomic.Int64
	mu   sync.Mutex
	idle chan struct{} // closed when n falls to zero; nil when nobody waits
}

func (a *admitCount) begin() { a.n.Add(1) }

func (a *admitCount) end() {
	if a.n.Add(-1) != 0 {
		return
	}
	a.mu.Lock()
	if a.idle != nil && a.n.Load() == 0 {
		close(a.idle)
		a.idle = nil
	}
	a.mu.Unlock()
}

// wait returns a channel closed once no connection is being admitted.
func (a *admitCount) wait() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n.Load() == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if a.idle == nil {
		a.idle = make(chan struct{})
	}
	return a.idle
}

// Admitted returns a channel that is closed once every connection accepted
// so far has been admitted, a session tracked by its backend (or ended:
// refused, or no dial answered): nothing then takes a backend slot any
// more, unless a listener accepts again. After Close has returned, that is
// for good; each admission is bounded by its own timeouts (proxy_timeout,
// the wait for a name to route by, queue_timeout, hold_timeout,
// connect_timeout and retries).
func (s *Server) Admitted() <-chan struct{} { return s.admitting.wait() }
