package listener

// What one connection holds while it lives, and the one place it is given
// back.

import (
	"net/netip"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/sockfd"
)

// lease is what one connection holds while it lives: its client's socket
// and its place under the Server's connection limit (always), then a
// source slot and a service slot in its service's admission state, and its
// backend's slot. release gives back all that it holds, once, whoever ends
// the connection: nothing else closes the client's socket.
type lease struct {
	srv     *Server
	c       int              // the client's socket, closed by release
	a       *admission       // the service's, whose source and service slots it holds
	src     netip.Addr       // the source slot's address
	perSrc  int              // and its limit; 0: no source slot is held
	service bool             // a service slot is held in a
	b       *backend.Backend // whose slot is held; nil: none
}

// holdSource takes a slot for client address ip in a, under a limit of max
// connections at once (0: unlimited, nothing to hold); false when ip is at it.
func (l *lease) holdSource(a *admission, ip netip.Addr, max int) bool {
	if !a.acquireSource(ip, max) {
		return false
	}
	l.a, l.src, l.perSrc = a, ip, max
	return true
}

// holdService takes a slot of the service (pol.MaxConns) in the group the
// source slot is in, waiting up to pol.QueueTimeout from start for one
// (and marking tm waited), unless the client of socket c leaves
// meanwhile. It reports false when the connection must be refused.
func (l *lease) holdService(pol *Policy, start time.Time, c int, tm *timing) bool {
	ok := l.a.acquire(pol.MaxConns)
	if !ok && pol.QueueTimeout > 0 {
		tm.waited = true
		ok = l.a.admit(pol.MaxConns, start.Add(pol.QueueTimeout), goneEvery, func() bool { return clientGone(c) })
	}
	l.service = ok
	return ok
}

// release closes the client's socket and gives back every slot l holds,
// then runs each of last (the access line: whoever reads it sees the
// slots free), then ends the connection's count under the Server's limit
// and in its WaitGroup (so that Wait returns only once the line is
// written).
func (l *lease) release(last ...func()) {
	sockfd.Close(l.c)
	if l.b != nil {
		l.srv.releaseBackend(l.b) // wakes a connection queued for its slot
		l.b = nil
	}
	if l.service {
		l.a.release()
		l.service = false
	}
	if l.perSrc != 0 {
		l.a.releaseSource(l.src, l.perSrc)
		l.perSrc = 0
	}
	for _, f := range last {
		f()
	}
	l.srv.connDone()
}
