package listener

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/sched"
)

// How a connection ended, as the access log says it.
const (
	endClient    = "client close"   // the client sent FIN first; both sides then closed cleanly
	endBackend   = "backend close"  // the backend sent FIN first
	endReset     = "reset"          // an error (RST, write failure) on either side
	endIdle      = "idle timeout"   // no byte either way for idle_timeout
	endConnect   = "connect failed" // no backend could be dialled
	endNoBackend = "no backend"     // nothing eligible to dial: every backend down, draining or at weight 0
	endFull      = "full"           // every eligible backend, or the service, at max_conns (past queue_timeout)
	endDrained   = "drained"        // closed at a drain deadline
)

// session is one proxied connection after a successful dial. It owns both
// sockets and the count of Server.wg that handle took for the connection.
// Its two halves run in goroutines of their own; the last one to end closes
// both sockets, releases the backend, logs and calls connDone (finish).
type session struct {
	srv     *Server
	svc     *sched.Service
	t       *sched.Target
	client  *net.TCPConn
	backend *net.TCPConn
	addr    netip.AddrPort // the client's
	start   time.Time
	idle    time.Duration // 0 = none

	up   half // client → backend
	down half // backend → client

	// The parked design only (parked.go).
	pl                  *poller     // the epoll both sockets are registered in; nil in the pooled design
	clientFD, backendFD int         // the sockets' descriptors
	timer               *time.Timer // the idle timer
	idleFired           atomic.Bool // the idle timer stopped the session

	live     atomic.Int32 // halves still running
	last     atomic.Int64 // mono() of the last byte written either way (idle timeout only)
	first    atomic.Int32 // which half reached EOF first: 1 up, 2 down
	failed   atomic.Int32 // which half ended with an error first: 1 up, 2 down
	stopping atomic.Bool  // both sockets are being shut down: errors and EOFs from now on are its echo
	drained  atomic.Bool
}

var errIdle = errors.New("idle timeout")

func newSession(s *Server, svc *sched.Service, t *sched.Target, client, backend *net.TCPConn, addr netip.AddrPort, start time.Time) *session {
	ss := &session{srv: s, svc: svc, t: t, client: client, backend: backend, addr: addr, start: start, idle: svc.IdleTimeout}
	ss.up = half{ss: ss, id: 1, src: client, dst: backend, x: newXfer(&s.pipes, s.mode)}
	ss.down = half{ss: ss, id: 2, src: backend, dst: client, x: newXfer(&s.pipes, s.mode)}
	return ss
}

// run starts both halves and returns; the session finishes itself.
func (ss *session) run() {
	ss.live.Store(2)
	if ss.idle > 0 {
		ss.last.Store(mono())
		d := time.Now().Add(ss.idle)
		ss.client.SetDeadline(d)
		ss.backend.SetDeadline(d)
	}
	go ss.up.run()   // exits when the client → backend direction ends
	go ss.down.run() // exits when the backend → client direction ends
}

// Close makes both directions end now; the session then ends as drained.
// It lets a backend's drain deadline close a session it tracks.
func (ss *session) Close() error {
	ss.drained.Store(true)
	ss.stop()
	return nil
}

// stop shuts down both sockets both ways. That wakes a half waiting on
// either (reads then see EOF, writes EPIPE) without closing a descriptor
// that the other half may be using: only finish closes.
func (ss *session) stop() {
	if ss.stopping.Swap(true) {
		return
	}
	shutdown(ss.client)
	shutdown(ss.backend)
}

func shutdown(c *net.TCPConn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) }) // ENOTCONN after a reset: nothing to do
}

// halfDone is called by each half as it ends. A clean EOF is passed on as a
// FIN and the other direction keeps flowing; an error stops both.
func (ss *session) halfDone(h *half, err error) {
	h.x.release()
	h.err = err
	switch {
	case err != nil:
		ss.failed.CompareAndSwap(0, h.id)
		ss.stop()
	case !ss.stopping.Load():
		ss.first.CompareAndSwap(0, h.id)
		h.dst.CloseWrite()
	}
	if ss.live.Add(-1) == 0 {
		if ss.pl != nil && ss.srv.logsAccess(ss.svc) {
			// Not in the poller, which runs parked directions: the access
			// log may block on a slow sink and would stall them all.
			go ss.finish() // exits when the session is logged and released
			return
		}
		ss.finish()
	}
}

// finish closes both sockets, gives the backend its slot back, logs the
// session and ends its count in the Server's WaitGroup.
func (ss *session) finish() {
	if ss.pl != nil {
		ss.pl.forget(ss)
		if ss.timer != nil {
			ss.timer.Stop()
		}
	}
	ss.client.Close()
	ss.backend.Close()
	b := ss.t.B
	b.Untrack(ss)
	b.Release()
	ss.svc.Group.Release()
	ss.svc.Group.ReleaseSource(ss.addr.Addr(), ss.svc.MaxConnsPerSource)
	ss.srv.access(ss.svc, ss.addr, ss.t, ss.start, ss.up.n, ss.down.n, ss.end(), ss.firstErr())
	ss.srv.connDone()
}

// firstErr is the error that ended the session, or nil.
func (ss *session) firstErr() error {
	if ss.idleFired.Load() {
		return errIdle
	}
	switch ss.failed.Load() {
	case 1:
		return ss.up.err
	case 2:
		return ss.down.err
	}
	return nil
}

// end says how the session ended.
func (ss *session) end() string {
	if ss.drained.Load() {
		return endDrained
	}
	if err := ss.firstErr(); err != nil {
		if errors.Is(err, errIdle) {
			return endIdle
		}
		return endReset
	}
	if ss.first.Load() == 2 {
		return endBackend
	}
	return endClient
}
