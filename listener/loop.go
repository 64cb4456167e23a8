package listener

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// fulcrum's data path: event loops over raw descriptors. An idle
// connection holds no goroutine, buffer or pipe; a busy one is served where
// its readiness event lands, with no goroutine woken per message.
//
// Sockets never enter Go's poller: accept4 on the listening socket and a
// non-blocking connect (accept.go, connect.go) give descriptors that only a loop's
// epoll watches, edge-triggered (IN|RDHUP|ET, and OUT once a write to it
// would block). A Server has one loop per P (and fulcrum one loop, and
// P, per CPU it may use, or [process] loops: procs.go), sessions spread
// round robin. A loop's epoll descriptor
// is itself watched by Go's poller (a nested epoll): the loop's goroutine
// parks there, holding no thread, and when woken runs, inline, whatever
// directions its events wake, each until it would block or has used its
// budget, after which it goes on in a goroutine of its own until it would
// block (a bulk transfer then does not hold up the other sessions of its
// loop). The syscalls that move bytes never block and are made raw (no
// entersyscall): the loop keeps its P, and the runtime does not hand it off
// or wake sysmon per message.
//
// Why nested, and what the other designs cost, is measured in
// bench/README.md ("the loop nested in Go's poller").
//
// Lost wakeups are what can go wrong, so:
//   - a direction's state is parked, running, kicked (an event came while
//     running: run again) or done, changed only by compare-and-swap, so that
//     one runner at a time owns its xfer and no kick is lost between "would
//     block" and "parked";
//   - a direction that would write wants EPOLLOUT before it writes, since an
//     edge between the EAGAIN and the flag would be lost, and EPOLLOUT wakes
//     only a direction that wants it;
//   - after a read shorter than the buffer, the socket was empty then, and
//     new bytes make a new edge, so the direction parks without the read that
//     would return EAGAIN; unless an event for that socket carried
//     RDHUP|HUP|ERR|PRI (counted before the kick) since a read last found
//     it empty, since a FIN already queued behind the bytes read makes no
//     new edge, and a read stops short at an urgent mark with bytes queued
//     behind it. A stale event (an earlier use of the number) costs reads
//     to EAGAIN until the next one.
//
// Descriptors are closed only by session.finish, once both directions are
// done and nothing else (stop) is using them, after their table entries are
// cleared: a descriptor number reused by a new connection then never maps
// to the old session, and a stale event costs at most a spurious kick.

const (
	stParked  int32 = iota // parked: no goroutine, waiting for an event
	stRunning              // a runner owns the direction
	stKicked               // running, and an event came meanwhile
	stDone                 // ended; never runs again
)

// runBudget is how many bytes a direction moves inline in the loop, per
// kick, before it continues in a goroutine of its own: a bound in bytes,
// not in rounds, since a round of splice moves up to a pipe (1 MiB), and
// sixteen of them held up every other session of the loop for
// milliseconds. A round run inline splices at most this much. Sixteen
// rounds of the buffer, as before for small messages.
const runBudget = 16 * bufSize

// loop is one epoll instance and the goroutine that waits on it.
type loop struct {
	epfd int
	f    *os.File                  // epfd, non-blocking, so that Go's poller watches it; closed by close
	tab  []atomic.Pointer[session] // by descriptor: the session a socket belongs to
	wait []atomic.Pointer[waiter]  // by descriptor: a goroutine waiting for a socket not yet in a session (await)
	done chan struct{}             // closed when run returns
}

// waiter is a goroutine waiting in await for one event on a socket.
type waiter struct{ ready chan struct{} }

func newLoop() (*loop, error) {
	epfd, err := sockfd.EpollCreate()
	if err != nil {
		return nil, err
	}
	// The tables cover every descriptor the process may ever open: the hard
	// limit, which the soft one can be raised to at any time.
	cur, hard, err := sockfd.Nofile()
	if err != nil {
		sockfd.Close(epfd)
		return nil, err
	}
	n := min(max(hard, cur), 1<<20)
	lp := &loop{epfd: epfd, f: os.NewFile(uintptr(epfd), "fulcrum-epoll"), done: make(chan struct{}),
		tab: make([]atomic.Pointer[session], n), wait: make([]atomic.Pointer[waiter], n)}
	go lp.run() // exits when close closes f
	return lp, nil
}

// close stops the loop, waits for its goroutine and closes its epoll. No
// session or waiter may be registered any more.
func (lp *loop) close() {
	lp.f.Close()
	<-lp.done
}

// run waits for events and dispatches them. The callback drains the ready
// list before it lets Go's poller wait again: the outer registration is
// edge-triggered, and an inner event left unread would raise no new edge.
func (lp *loop) run() {
	defer close(lp.done)
	rc, err := lp.f.SyscallConn()
	if err != nil {
		return
	}
	var events [128]unix.EpollEvent
	wait := func(fd uintptr) bool {
		for {
			n, err := sockfd.EpollWait(int(fd), events[:])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return true // EBADF: being closed
			}
			for i := range n {
				lp.dispatch(events[i])
				seamAt(seamBatch, nil)
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
// wants output, or on hang-up or error. An event for a socket not in a
// session wakes the goroutine awaiting it, if any.
func (lp *loop) dispatch(ev unix.EpollEvent) {
	fd := int(ev.Fd)
	if fd < 0 || fd >= len(lp.tab) {
		return
	}
	ss := lp.tab[fd].Load()
	if ss == nil {
		if w := lp.wait[fd].Swap(nil); w != nil {
			close(w.ready)
		}
		return // else an event for a socket closed meanwhile
	}
	in, out := &ss.up, &ss.down // the halves that read and write fd
	if fd == ss.backendFD {
		in, out = &ss.down, &ss.up
	}
	e := ev.Events
	if e&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLPRI) != 0 {
		in.hup.Add(1) // before the kick: see the package comment
	}
	if e&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLPRI) != 0 {
		in.kick()
	}
	if e&(unix.EPOLLHUP|unix.EPOLLERR) != 0 || e&unix.EPOLLOUT != 0 && out.wantOut.Load() {
		out.kick()
	}
}

// epollIn is what a socket is registered for; armOut adds EPOLLOUT.
// EPOLLPRI: urgent data (MSG_OOB) came, and reads stop at its mark (xfer.go).
const epollIn = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLPRI | unix.EPOLLET

// armOut adds EPOLLOUT to fd's registration, the first time a write to it
// would block: until then its output edges would only wake the loop for
// nothing. EPOLL_CTL_MOD reports readiness at once, so space freed between
// the EAGAIN and the MOD is not lost.
func (lp *loop) armOut(fd int) error {
	ev := unix.EpollEvent{Events: epollIn | unix.EPOLLOUT, Fd: int32(fd)}
	return sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// register adds fd to the epoll for input, or changes its registration to
// that if await left it registered here.
func (lp *loop) register(fd int) error {
	ev := unix.EpollEvent{Events: epollIn, Fd: int32(fd)}
	err := sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	if err == unix.EEXIST {
		err = sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	}
	return err
}

// forget unmaps both sockets of ss; it comes before they are closed, so a
// descriptor number reused by a new session never maps to ss.
func (lp *loop) forget(ss *session) {
	if c := ss.clientFD; c >= 0 && c < len(lp.tab) {
		lp.tab[c].CompareAndSwap(ss, nil)
	}
	if b := ss.backendFD; b >= 0 && b < len(lp.tab) {
		lp.tab[b].CompareAndSwap(ss, nil)
	}
}

// own gives the half begin held to the event loop: parked, or run now if
// an event came for it meanwhile.
func (h *half) own() {
	if h.state.CompareAndSwap(stRunning, stParked) {
		return
	}
	h.state.Store(stRunning) // kicked while begin held it
	h.runParked(runBudget)
}

// abandon ends a half that begin held and that never ran.
func (h *half) abandon() {
	h.state.Store(stDone)
	h.x.free()
	h.ss.unref()
}

// kick makes the direction run: now, in the caller, if it is parked; again
// after its current run if it is running.
func (h *half) kick() {
	for {
		switch h.state.Load() {
		case stParked:
			if h.state.CompareAndSwap(stParked, stRunning) {
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
// it would block (it parks), ends, or has moved budget bytes (it goes on in
// a goroutine of its own); budget 0 is no limit. The budget is the kick's,
// runs again for kicks that came meanwhile included.
func (h *half) runParked(budget int) {
	left := budget
	for {
		switch r, err := h.step(budget, &left); r {
		case stepDone:
			h.state.Store(stDone)
			h.ss.halfDone(h, err)
			return
		case stepMore:
			go h.runParked(0) // owns the direction now; exits when it parks or ends
			return
		}
		if h.state.CompareAndSwap(stRunning, stParked) {
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

// step runs fill/flush rounds on the raw descriptors, taking the bytes
// each fill brings in from *left, while any are left (budget 0: no limit).
func (h *half) step(budget int, left *int) (stepResult, error) {
	x := &h.x
	most := pipeSize // what one splice may bring in
	if budget > 0 {
		most = min(most, budget)
	}
	for budget == 0 || *left > 0 {
		if h.ss.stopping.Load() {
			return stepDone, nil
		}
		if x.pending() {
			h.wantOut.Store(true) // before the write: see the package comment
			n, err := x.flush(h.dfd)
			h.count(n)
			if err == unix.EAGAIN {
				if !h.outArmed {
					if err := h.ss.lp.armOut(h.dfd); err != nil {
						return stepDone, err
					}
					h.outArmed = true
				}
				// The source may fill while this waits for room, and the
				// input edge that says so can wake a run that only finds
				// the flush blocked again: once the flush goes through, read
				// rather than trust the short read made before it.
				h.drained = false
				return stepBlocked, nil
			}
			h.wantOut.Store(false)
			if err != nil {
				return stepDone, err
			}
			if h.drained && h.hup.Load() == h.hupSeen {
				h.drained = false
				return stepBlocked, nil
			}
		}
		hup := h.hup.Load() // before the read: an event after it counts
		n, err := x.fill(h.sfd, hup != h.hupSeen, most)
		switch {
		case err == unix.EAGAIN:
			// src was empty: what the events counted so far said (a FIN,
			// an urgent mark, or nothing, for a stale event of an earlier
			// use of the number) has been read.
			h.hupSeen = hup
			return stepBlocked, nil
		case err != nil:
			return stepDone, err
		case n == 0:
			return stepDone, nil // EOF
		}
		h.drained = x.buf != nil && n < bufSize
		*left -= n
	}
	return stepMore, nil
}

// await waits until fd, a socket in no session, has one of events (or a
// hang-up or error), or deadline passes (os.ErrDeadlineExceeded; a zero
// deadline is none). It registers fd one-shot in lp, which wakes it: added,
// or modified if *registered says an earlier await left it here; it sets
// *registered once it is. The registration outlives the wait, disarmed, so
// that a later await or the session's register in lp modifies it (register
// handles both). An event may come for an earlier use of fd's number, so
// the caller looks again and may await again.
func (lp *loop) await(fd int, events uint32, deadline time.Time, registered *bool) error {
	if fd >= len(lp.wait) {
		return unix.EMFILE
	}
	w := &waiter{ready: make(chan struct{})}
	lp.wait[fd].Store(w) // before the registration, which may report readiness at once
	ev := unix.EpollEvent{Events: events | unix.EPOLLONESHOT, Fd: int32(fd)}
	op := unix.EPOLL_CTL_ADD
	if *registered {
		op = unix.EPOLL_CTL_MOD
	}
	err := sockfd.EpollCtl(lp.epfd, op, fd, &ev)
	if err == unix.EEXIST { // an earlier peeker's wait left it here (the PROXY header's, then the hello's)
		err = sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	}
	if err != nil {
		lp.wait[fd].CompareAndSwap(w, nil)
		return err
	}
	*registered = true
	if deadline.IsZero() {
		<-w.ready
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-w.ready:
		return nil
	case <-t.C:
		if lp.wait[fd].CompareAndSwap(w, nil) {
			return os.ErrDeadlineExceeded // "i/o timeout", as net.Dialer says
		}
		<-w.ready // the loop took it at the same moment: it is closing ready
		return nil
	}
}
