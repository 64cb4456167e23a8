package listener

import (
	"math"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The parked copy design: an idle connection holds no goroutine.
//
// Both sockets of a parked session are also registered, edge-triggered
// (IN|RDHUP|ET, and OUT once a write to it would block), in an epoll
// instance of the Server's, whose descriptor is itself watched by Go's
// poller (a nested epoll): a poller goroutine waits on it and runs whatever
// directions its events wake, inline, each until it would block or has
// used its budget, after which it goes on in a goroutine of its own until
// it would block. A Server has one poller per two Ps, sessions spread round
// robin, so that small-message work is not bound to one core on a large
// machine. Directions never wait through Go's poller, where the sockets
// stay registered: their readiness there goes unused, and closing a socket
// removes it from both epolls.
//
// Lost wakeups are what can go wrong (pitfall 3 of the spike), so:
//   - a direction's state is idle, running, kicked (an event came while
//     running: run again) or done, changed only by compare-and-swap, so that
//     one runner at a time owns its xfer and no kick is lost between "would
//     block" and "parked";
//   - a direction that would write wants EPOLLOUT before it writes, since an
//     edge between the EAGAIN and the flag would be lost, and EPOLLOUT wakes
//     only a direction that wants it;
//   - after a read shorter than the buffer, the socket was empty then, and
//     new bytes make a new edge, so the direction parks without the read that
//     would return EAGAIN; unless an event for that socket carried
//     RDHUP|HUP|ERR (flag set before the kick), since a FIN already queued
//     behind the bytes read makes no new edge.

const (
	stIdle    int32 = iota // parked: no goroutine, waiting for an event
	stRunning              // a runner owns the direction
	stKicked               // running, and an event came meanwhile
	stDone                 // ended; never runs again
)

// runBudget is how many fill/flush rounds a direction runs inline in the
// poller before it continues in a goroutine of its own.
const runBudget = 16

// poller is one epoll instance for parked sessions, and the goroutine that
// waits on it through Go's poller.
type poller struct {
	epfd int
	f    *os.File                  // epfd, non-blocking, so Go's poller watches it; closed by close
	tab  []atomic.Pointer[session] // by descriptor: the session a socket belongs to
	done chan struct{}             // closed when run returns
}

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	pl := &poller{epfd: epfd, f: os.NewFile(uintptr(epfd), "fulcrum-epoll"), done: make(chan struct{}),
		tab: make([]atomic.Pointer[session], min(lim.Cur, 1<<20))}
	go pl.run() // exits when close closes f
	return pl, nil
}

// close stops the poller and waits for its goroutine. No session may be
// registered any more.
func (pl *poller) close() {
	pl.f.Close()
	<-pl.done
}

// run waits for events and dispatches them. The callback drains the ready
// list before it lets Go's poller wait again: the outer registration is
// edge-triggered, and an inner event left unread would raise no new edge.
func (pl *poller) run() {
	defer close(pl.done)
	rc, err := pl.f.SyscallConn()
	if err != nil {
		return
	}
	var events [128]unix.EpollEvent
	wait := func(fd uintptr) bool {
		for {
			n, err := unix.EpollWait(int(fd), events[:], 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return true // EBADF: being closed
			}
			for i := range n {
				pl.dispatch(events[i])
			}
			if n < len(events) {
				return false
			}
		}
	}
	for rc.Read(wait) == nil {
	}
}

// dispatch wakes the directions an event concerns: the one reading the
// socket on input, hang-up or error; the one writing it on output if it
// wants output, or on hang-up or error.
func (pl *poller) dispatch(ev unix.EpollEvent) {
	fd := int(ev.Fd)
	if fd < 0 || fd >= len(pl.tab) {
		return
	}
	ss := pl.tab[fd].Load()
	if ss == nil { // an event for a socket closed meanwhile
		return
	}
	in, out := &ss.up, &ss.down // the halves that read and write fd
	if fd == ss.backendFD {
		in, out = &ss.down, &ss.up
	}
	e := ev.Events
	if e&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		in.hup.Store(true) // before the kick: see the package comment
	}
	if e&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		in.kick()
	}
	if e&(unix.EPOLLHUP|unix.EPOLLERR) != 0 || e&unix.EPOLLOUT != 0 && out.wantOut.Load() {
		out.kick()
	}
}

// epollIn is what a socket is registered for; armOut adds EPOLLOUT.
const epollIn = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET

// armOut adds EPOLLOUT to fd's registration, the first time a write to it
// would block: until then its output edges would only wake the poller for
// nothing. EPOLL_CTL_MOD reports readiness at once, so space freed between
// the EAGAIN and the MOD is not lost.
func (pl *poller) armOut(fd int) error {
	ev := unix.EpollEvent{Events: epollIn | unix.EPOLLOUT, Fd: int32(fd)}
	return unix.EpollCtl(pl.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// add registers both sockets of ss. On failure nothing stays registered and
// the session must copy in the pooled design.
func (pl *poller) add(ss *session) bool {
	c, b := ss.clientFD, ss.backendFD
	if c < 0 || b < 0 || c >= len(pl.tab) || b >= len(pl.tab) {
		return false
	}
	pl.tab[c].Store(ss) // before EPOLL_CTL_ADD, which may report readiness at once
	pl.tab[b].Store(ss)
	ev := unix.EpollEvent{Events: epollIn}
	ev.Fd = int32(c)
	if err := unix.EpollCtl(pl.epfd, unix.EPOLL_CTL_ADD, c, &ev); err != nil {
		pl.forget(ss)
		return false
	}
	ev.Fd = int32(b)
	if err := unix.EpollCtl(pl.epfd, unix.EPOLL_CTL_ADD, b, &ev); err != nil {
		unix.EpollCtl(pl.epfd, unix.EPOLL_CTL_DEL, c, nil)
		pl.forget(ss)
		return false
	}
	return true
}

// forget unmaps both sockets of ss; it comes before they are closed, so a
// descriptor number reused by a new session never maps to ss. Closing the
// sockets removes them from the epoll.
func (pl *poller) forget(ss *session) {
	pl.tab[ss.clientFD].CompareAndSwap(ss, nil)
	pl.tab[ss.backendFD].CompareAndSwap(ss, nil)
}

// park starts ss in the parked design: it registers both sockets, whose
// readiness, if any, the epoll reports at once. It returns false if ss must
// copy in the pooled design instead.
func (ss *session) park(pl *poller) bool {
	ss.clientFD, ss.backendFD = rawFD(ss.client), rawFD(ss.backend)
	ss.up.sfd, ss.up.dfd = ss.clientFD, ss.backendFD
	ss.down.sfd, ss.down.dfd = ss.backendFD, ss.clientFD
	ss.pl = pl
	ss.live.Store(2)
	if ss.idle > 0 {
		ss.last.Store(mono())
		// Armed by Reset after the assignment, so that idleCheck sees ss.timer.
		ss.timer = time.AfterFunc(time.Duration(math.MaxInt64), ss.idleCheck)
		ss.timer.Reset(ss.idle)
	}
	if pl.add(ss) {
		return true
	}
	if ss.timer != nil {
		ss.timer.Stop()
	}
	ss.pl = nil
	return false
}

// rawFD is c's descriptor, or -1. It stays valid until the session closes
// c, which only finish does, once neither direction can run again.
func rawFD(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// idleCheck runs when the idle timer fires: it stops the session if no
// byte has moved either way for idle_timeout, or sets the timer to fire
// idle_timeout after the last byte.
func (ss *session) idleCheck() {
	if ss.live.Load() == 0 {
		return
	}
	quiet := time.Duration(mono() - ss.last.Load())
	if quiet < ss.idle {
		ss.timer.Reset(ss.idle - quiet)
		return
	}
	ss.idleFired.Store(true)
	ss.stop()
}

// kick makes the direction run: now, in the caller, if it is parked; again
// after its current run if it is running.
func (h *half) kick() {
	for {
		switch h.state.Load() {
		case stIdle:
			if h.state.CompareAndSwap(stIdle, stRunning) {
				h.runParked(runBudget)
				return
			}
		case stRunning:
			if h.state.CompareAndSwap(stRunning, stKicked) {
				return
			}
		default: // already kicked, or done
			return
		}
	}
}

// runParked runs the direction, which the caller owns (stRunning), until
// it would block (it parks), ends, or has run budget rounds (it goes on in
// a goroutine of its own); budget 0 is no limit.
func (h *half) runParked(budget int) {
	for {
		switch r, err := h.step(budget); r {
		case stepDone:
			h.state.Store(stDone)
			h.ss.halfDone(h, err)
			return
		case stepMore:
			go h.runParked(0) // owns the direction now; exits when it parks or ends
			return
		}
		if h.state.CompareAndSwap(stRunning, stIdle) {
			return
		}
		h.state.Store(stRunning) // kicked meanwhile: there may be more
	}
}

type stepResult uint8

const (
	stepBlocked stepResult = iota // would block: park
	stepDone                      // EOF (err nil), an error, or the session is stopping
	stepMore                      // the budget is used up and there may be more
)

// step runs fill/flush rounds on the raw descriptors.
func (h *half) step(budget int) (stepResult, error) {
	x := &h.x
	for i := 0; budget == 0 || i < budget; i++ {
		if h.ss.stopping.Load() {
			return stepDone, nil
		}
		if x.pending() {
			h.wantOut.Store(true) // before the write: see the package comment
			n, err := x.flush(h.dfd)
			h.count(n)
			if err == unix.EAGAIN {
				if !h.outArmed {
					if err := h.ss.pl.armOut(h.dfd); err != nil {
						return stepDone, err
					}
					h.outArmed = true
				}
				return stepBlocked, nil
			}
			h.wantOut.Store(false)
			if err != nil {
				return stepDone, err
			}
			if h.drained && !h.hup.Load() {
				h.drained = false
				return stepBlocked, nil
			}
		}
		n, err := x.fill(h.sfd)
		switch {
		case err == unix.EAGAIN:
			return stepBlocked, nil
		case err != nil:
			return stepDone, err
		case n == 0:
			return stepDone, nil // EOF
		}
		h.drained = x.buf != nil && n < bufSize
	}
	return stepMore, nil
}
