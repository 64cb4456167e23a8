package listener

import (
	"errors"
	"math"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
	"fulcrum/sched"
)

// How a connection ended, as the access log says it.
const (
	endClient    = "client close"       // the client sent FIN first; both sides then closed cleanly
	endBackend   = "backend close"      // the backend sent FIN first
	endReset     = "reset"              // an error (RST, write failure) on either side
	endIdle      = "idle timeout"       // no byte either way for idle_timeout
	endHalfClose = "half-close timeout" // one direction closed, and the other moved no byte for half_close_timeout
	endConnect   = "connect failed"     // no backend could be dialled
	endNoBackend = "no backend"         // nothing eligible to dial: every backend down, draining or at weight 0
	endFull      = "full"               // every eligible backend, or the service, at max_conns (past queue_timeout)
	endDrained   = "drained"            // closed at a drain deadline
	endGone      = "client gone"        // the client left while waiting (queue_timeout, hold_timeout), before any dial
)

// session is one proxied connection after a successful dial. It owns both
// sockets (raw descriptors, outside Go's poller) and the count of Server.wg
// that handle took for the connection. Its two halves run in an event loop
// (loop.go); whoever ends last of the halves and stop closes both sockets,
// releases the backend, logs and calls connDone (finish).
type session struct {
	srv *Server
	accessInfo
	t                   *sched.Target
	lease               lease         // given back by finish
	clientFD, backendFD int           // the sockets; closed by finish only
	idle                time.Duration // 0 = none
	halfClose           time.Duration // once one direction has closed, the other's idle limit; 0 = none

	up   half // client → backend
	down half // backend → client

	lp        *loop       // the epoll both sockets are registered in
	timer     *time.Timer // the idle timer; nil without idle timeout until a direction closes
	idleFired atomic.Bool // the idle timer stopped the session
	halfFired atomic.Bool // it did so as the half-close timeout

	live     atomic.Int32 // admission until begin has registered both sockets, halves still running, and a stop shutting the sockets down
	last     atomic.Int64 // mono() of the last byte written either way (idle or half-close timeout only)
	first    atomic.Int32 // which half reached EOF first: 1 up, 2 down
	failed   atomic.Int32 // which half ended with an error first: 1 up, 2 down
	stopping atomic.Bool  // both sockets are being shut down: errors and EOFs from now on are its echo
	drained  atomic.Bool
	cutEnd   atomic.Pointer[string] // why backend.Cut ended it (backend.Cut*); nil: it was not cut
}

var (
	errIdle      = errors.New("idle timeout")
	errHalfClose = errors.New("half-close timeout: one direction closed, the other idle")
)

// newSession makes the session of in, whose backend t connected on socket
// backend; it takes in's lease and client socket over.
func newSession(s *Server, in *inbound, t *sched.Target, backend int) *session {
	ss := &session{srv: s, accessInfo: in.accessInfo, t: t, lease: in.l, clientFD: in.c, backendFD: backend,
		idle: in.pol.IdleTimeout, halfClose: in.pol.HalfCloseTimeout}
	ss.up = half{ss: ss, id: 1, x: newXfer(&s.pipes, s.mode)}
	ss.down = half{ss: ss, id: 2, x: newXfer(&s.pipes, s.mode)}
	ss.live.Store(1) // admission's: stop can shut a session down before it begins (begin)
	return ss
}

// run starts the session in one of the Server's event loops and returns;
// the session finishes itself. If no loop can take it, it ends at once as
// reset.
func (ss *session) run() {
	lp, err := ss.srv.loop()
	if err != nil {
		ss.up.err = err
		ss.failed.Store(1)
		ss.unref() // admission's count, the only one: finish
		return
	}
	ss.begin(lp)
}

// Close makes both directions end now; the session then ends as drained.
// It lets a backend's drain deadline close a session it tracks.
func (ss *session) Close() error {
	ss.drained.Store(true)
	ss.stop()
	return nil
}

// Cut makes both directions end now, as backend.Cut does to a backend's
// sessions (on_down, on_role_change, a split brain): the session then ends
// with end as its access line's end.
func (ss *session) Cut(end string) {
	ss.cutEnd.Store(&end)
	ss.stop()
}

// stop shuts down both sockets both ways. That wakes a half waiting on
// either (reads then see EOF, writes EPIPE) without closing a descriptor
// that a half may be using: only finish closes. stop counts itself in live
// while it uses the descriptors, so that finish cannot close them (and the
// numbers be reused) under it; a session already finishing is left alone.
func (ss *session) stop() {
	if ss.stopping.Swap(true) || !ss.hold() {
		return
	}
	sockfd.Shutdown(ss.clientFD, unix.SHUT_RDWR)
	sockfd.Shutdown(ss.backendFD, unix.SHUT_RDWR)
	ss.unref()
}

// hold counts a use of the session's descriptors in live, so that finish
// cannot close them (and their numbers be reused) until unref gives it back.
// A session already finishing is refused: false.
func (ss *session) hold() bool {
	for {
		n := ss.live.Load()
		if n == 0 {
			return false
		}
		if ss.live.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// halfDone is called by each half as it ends. A clean EOF is passed on as a
// FIN and the other direction keeps flowing; an error stops both.
func (ss *session) halfDone(h *half, err error) {
	h.x.free()
	h.err = err
	switch {
	case err != nil:
		ss.failed.CompareAndSwap(0, h.id)
		ss.stop()
	case !ss.stopping.Load():
		if ss.first.CompareAndSwap(0, h.id) && ss.halfClose > 0 {
			ss.armHalfClose()
		}
		// A FIN; the other direction keeps flowing. Unless it has ended
		// too: then close sends the FIN, one syscall fewer per connection
		// (its socket has nothing unread, so close does not reset).
		if ss.other(h).state.Load() != stDone {
			sockfd.Shutdown(h.dfd, unix.SHUT_WR)
		}
	}
	ss.unref()
}

// other is the half that is not h.
func (ss *session) other(h *half) *half {
	if h == &ss.up {
		return &ss.down
	}
	return &ss.up
}

// unref ends one count of live; the last finishes the session.
func (ss *session) unref() {
	if ss.live.Add(-1) != 0 {
		return
	}
	if ss.srv.logsAccess(ss.pol) {
		// Not in the loop: the access log may block on a slow sink and
		// would stall every session of the loop.
		go ss.finish() // exits when the session is logged and released
		return
	}
	ss.finish()
}

// finish closes both sockets and releases the session's lease: the
// backend's, service's and source's slots, then the access line, then its
// count in the Server's WaitGroup.
func (ss *session) finish() {
	if ss.lp != nil {
		ss.lp.forget(ss)
	}
	if ss.timer != nil {
		ss.timer.Stop()
	}
	sockfd.Close(ss.backendFD) // the client's: by the lease
	ss.t.B.Untrack(ss)
	ss.lease.release(func() {
		ss.srv.access(&ss.accessInfo, ss.t, ss.up.n, ss.down.n, ss.end(), ss.firstErr())
	})
}

// firstErr is the error that ended the session, or nil.
func (ss *session) firstErr() error {
	if ss.halfFired.Load() {
		return errHalfClose
	}
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
	if e := ss.cutEnd.Load(); e != nil {
		return *e
	}
	if ss.drained.Load() {
		return endDrained
	}
	if err := ss.firstErr(); err != nil {
		if errors.Is(err, errIdle) {
			return endIdle
		}
		if errors.Is(err, errHalfClose) {
			return endHalfClose
		}
		return endReset
	}
	if ss.first.Load() == 2 {
		return endBackend
	}
	return endClient
}

// RoleEpoch is the backend's role epoch when the session was dialled: a
// role change seen since then ends it, one seen before does not
// (backend.CutRole, on_role_change).
func (ss *session) RoleEpoch() uint64 { return ss.tm.roleEpoch }

// begin runs ss in lp: it registers both sockets, whose readiness, if any,
// the epoll reports at once. begin owns both halves (stRunning) until both
// sockets are registered: an event for the client socket that comes
// between the two registrations only marks its half kicked, and begin runs
// each half that was kicked once both are in. A failure ends the session
// through stop and release, as any other end, never by a direct finish:
// the admission's count in live (newSession) keeps the descriptors owned
// until every count is given back, once.
func (ss *session) begin(lp *loop) {
	c, b := ss.clientFD, ss.backendFD
	ss.up.sfd, ss.up.dfd = c, b
	ss.down.sfd, ss.down.dfd = b, c
	ss.lp = lp
	ss.up.state.Store(stRunning)
	ss.down.state.Store(stRunning)
	ss.live.Add(2) // the halves; admission holds its own count until the end of begin
	if ss.idle > 0 {
		ss.last.Store(mono())
		// Armed by Reset after the assignment, so that idleCheck sees ss.timer.
		ss.timer = time.AfterFunc(time.Duration(math.MaxInt64), ss.idleCheck)
		ss.timer.Reset(ss.idle)
	}
	var err error
	if c < 0 || b < 0 || c >= len(lp.tab) || b >= len(lp.tab) {
		err = unix.EBADF
	} else {
		lp.tab[c].Store(ss) // before EPOLL_CTL_ADD, which may report readiness at once
		lp.tab[b].Store(ss)
		if err = lp.register(c); err == nil {
			if err = seamAt(seamRegistered, ss); err == nil {
				err = lp.register(b)
			}
			if err != nil {
				// Out before the descriptors are closed: a registration
				// outlives close while another process holds the file.
				sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_DEL, c, nil)
			}
		}
	}
	if err != nil {
		ss.up.err = err
		ss.failed.CompareAndSwap(0, 1)
		ss.stop()
		ss.up.abandon()
		ss.down.abandon()
	} else {
		if keepAliveFor(ss.pol).Idle > 0 {
			ss.srv.lateKA.add(ss) // the backend socket's keepalive (keepalive.go)
		}
		ss.up.own()
		ss.down.own()
	}
	ss.unref() // admission's count: the session is the halves' now
}

// idleCheck runs when the idle timer fires: it stops the session if no
// byte has moved either way for its limit (idle_timeout, or once a
// direction has closed the shorter half_close_timeout), or sets the timer
// to fire that long after the last byte.
func (ss *session) idleCheck() {
	if ss.live.Load() == 0 {
		return
	}
	limit, half := ss.idleLimit()
	quiet := time.Duration(mono() - ss.last.Load())
	if quiet < limit {
		ss.timer.Reset(limit - quiet)
		return
	}
	ss.halfFired.Store(half)
	ss.idleFired.Store(true)
	ss.stop()
}

// idleLimit is how long the session may go without a byte: idle_timeout,
// or half_close_timeout when one direction has closed and it is shorter
// (half reports that).
func (ss *session) idleLimit() (limit time.Duration, half bool) {
	if ss.first.Load() != 0 && ss.halfClose > 0 && (ss.idle == 0 || ss.halfClose < ss.idle) {
		return ss.halfClose, true
	}
	return ss.idle, false
}

// armHalfClose starts the half-close limit when a direction has closed
// cleanly: the other direction's bytes are timed from now, by the idle
// timer (made now if idle_timeout did not make one). Called once, by the
// half that closed first.
func (ss *session) armHalfClose() {
	ss.last.Store(mono())
	if ss.timer == nil {
		// Armed by Reset after the assignment, so that idleCheck sees ss.timer.
		ss.timer = time.AfterFunc(time.Duration(math.MaxInt64), ss.idleCheck)
		ss.timer.Reset(ss.halfClose)
		return
	}
	if limit, _ := ss.idleLimit(); limit < ss.idle {
		ss.timer.Reset(limit) // sooner than the idle timer would look
	}
}
