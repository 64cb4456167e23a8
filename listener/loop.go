package listener

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// fulcrum's data path: event loops over raw descriptors. An idle
// connection holds no goroutine, buffer or pipe; a busy one is served where
// its readiness event lands, with no goroutine woken per message.
//
// Sockets never enter Go's poller, listening sockets included: every
// loop's epoll watches each listening socket, and the loop a connection
// wakes accepts it and serves it inline (accept.go); accept4 and a
// non-blocking connect (connect.go) give descriptors that only a loop's
// epoll watches, edge-triggered (IN|RDHUP|ET, and OUT once a write to it
// would block). A new connection whose backend answers at once is then one
// run of one loop's goroutine, from the readiness of the listening socket
// to the session's registration, and wakes no other thread. A Server has one loop per P (and fulcrum one loop, and
// P, per CPU it may use, or [process] loops: procs.go), sessions spread
// round robin, and the runtime one P more (reserveP). A loop's goroutine
// waits in epoll_wait itself and, when woken, runs inline whatever
// directions its events wake, each until it would block or has used its
// budget, after which it goes on in a goroutine of its own until it would
// block (a bulk transfer then does not hold up the other sessions of its
// loop). The syscalls that move bytes never block and are made raw (no
// entersyscall): the loop keeps its P, and the runtime does not hand it off
// or wake sysmon per message.
//
// The wait, too, is made raw while the loop is busy (run): it keeps its P
// through it, so a wake-up costs one epoll_wait, as nginx's worker makes.
// Nested in Go's poller, a wake-up cost three (the runtime's poll without
// blocking, its blocking poll, then the loop's own on its epoll): pinned,
// 10.0 syscalls per 64 B round trip of which 6.0 epoll waits, against
// nginx's 6.0 and 2.0. A loop holding its P leaves the runtime at least one
// for everything else (accept goroutines, checks, timers, admin; rawSlots,
// TestBusyLoopLeavesAP), yields it every 9 ms, and, idle for 50 ms, waits
// as an ordinary blocking syscall, whose P the runtime takes back: an idle
// process costs nothing. What each design costs is measured in
// bench/README.md ("the loop nested in Go's poller", "the loop's own wait").
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
	epfd    int
	wake    int                       // an eventfd in epfd (tagged wakeTag): close's wake-up
	closing atomic.Bool               // close has asked run to return
	waits   atomic.Uint64             // epoll waits made
	tab     []atomic.Pointer[session] // by descriptor: the session a socket belongs to
	wait    []atomic.Pointer[waiter]  // by descriptor: a goroutine waiting for a socket not yet in a session (await)
	done    chan struct{}             // closed when run returns, having closed epfd and wake

	accMu sync.Mutex                          // serialises watch and unwatch
	accs  atomic.Pointer[map[int32]*acceptor] // the listening sockets it watches (watch), by descriptor; copied on write
}

// loopRun is what a loop's goroutine holds while it runs the loop; when a
// connection it accepted and served inline must wait, detach hands it to a
// new goroutine, which goes on where this one left off (run).
type loopRun struct {
	events  [128]unix.EpollEvent
	raw     bool        // holds a raw slot
	yielded int64       // mono() when the loop last let the scheduler run
	busy    int64       // mono() of the last wait that found an event
	owned   []*acceptor // listening sockets this loop owns and accepts from (drainIn), with connections queued
}

// waiter is a goroutine waiting in await for one event on a socket.
type waiter struct{ ready chan struct{} }

// wakeTag is the data of the wake eventfd's registration: no descriptor.
const wakeTag = -1

func newLoop() (*loop, error) {
	epfd, err := sockfd.EpollCreate()
	if err != nil {
		return nil, err
	}
	wake, err := sockfd.Eventfd()
	if err != nil {
		sockfd.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeTag}
	if err := sockfd.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		sockfd.Close(wake)
		sockfd.Close(epfd)
		return nil, err
	}
	// The tables cover every descriptor the process may ever open: the hard
	// limit, which the soft one can be raised to at any time.
	cur, hard, err := sockfd.Nofile()
	if err != nil {
		sockfd.Close(wake)
		sockfd.Close(epfd)
		return nil, err
	}
	n := min(max(hard, cur), 1<<20)
	lp := &loop{epfd: epfd, wake: wake, done: make(chan struct{}),
		tab: make([]atomic.Pointer[session], n), wait: make([]atomic.Pointer[waiter], n)}
	lp.accs.Store(&map[int32]*acceptor{})
	go lp.run(&loopRun{}) // returns when close asks it to
	return lp, nil
}

// close stops the loop, waits for its goroutine, which closes its epoll
// and eventfd. No session or waiter may be registered any more.
func (lp *loop) close() {
	lp.closing.Store(true)
	sockfd.Signal(lp.wake)
	<-lp.done
}

// A loop holding its P yields it every rawYield, just under the 10 ms
// after which sysmon would preempt it with a signal, waiting no longer
// than that at a time; after rawIdle without an event it waits as a
// blocking syscall instead (run).
const (
	rawYield = 9 * time.Millisecond
	rawIdle  = 50 * time.Millisecond
)

// run waits for events and dispatches them. While events keep coming it
// waits in epoll_wait made raw: to the runtime the loop's goroutine is
// running, so its P stays with it and nothing else polls or wakes per
// wait. That is one system call per wake-up, as nginx's worker makes. A
// loop holds a P so only while a raw slot is free (rawSlots: one P is
// always left for everything else: accept goroutines, checks, timers, admin)
// and only while busy: after rawIdle without events it waits as a
// blocking syscall, the runtime hands its P on (sysmon, within 20 µs to
// 10 ms), and an idle loop costs nothing.
//
// A raw wait is interrupted (EINTR) by the signal with which the runtime
// preempts a goroutine (a GC's stop, sysmon after 10 ms); the call that
// follows yields at its stack check. With no such signal
// (GODEBUG=asyncpreemptoff=1) the raw wait's timeout bounds the stall.
//
// The listening sockets a batch's events made the loop's own are accepted
// from after the batch (drainIn); one left with connections queued makes
// the next wait not block. A connection accepted here that must wait hands
// r to a new goroutine, which runs the loop from where this one was, and
// this one returns into the connection's own work.
func (lp *loop) run(r *loopRun) {
	for {
		// Listening sockets first: a run handed over by detach goes on
		// with the one it was accepting from.
		for k := 0; k < len(r.owned); {
			a := r.owned[k]
			released, detached := a.s.drainIn(a, lp, r)
			if detached {
				return // r is another goroutine's now
			}
			if released {
				r.owned[k] = r.owned[len(r.owned)-1]
				r.owned[len(r.owned)-1] = nil
				r.owned = r.owned[:len(r.owned)-1]
				continue
			}
			k++
		}
		var n int
		var err error
		if !r.raw && rawSlots.take() {
			r.raw, r.yielded = true, mono()
			r.busy = r.yielded
		}
		switch {
		case r.raw:
			left := (int64(rawYield) - (mono() - r.yielded)) / int64(time.Millisecond)
			wait := int(max(left, 1))
			if len(r.owned) > 0 { // connections still queued: look, and accept them after this batch
				wait = 0
			}
			n, err = sockfd.EpollWaitFor(lp.epfd, r.events[:], wait)
			now := mono()
			if n > 0 || len(r.owned) > 0 {
				r.busy = now
			} else if err == nil && now-r.busy > int64(rawIdle) { // idle: give the P back
				rawSlots.give()
				r.raw = false
				n, err = sockfd.EpollWaitBlocking(lp.epfd, r.events[:])
			}
			if r.raw && now-r.yielded >= int64(rawYield) {
				// What the loop made runnable (a bulk half, an awaiter, a
				// finish) runs here, and sysmon does not signal the thread
				// to preempt a goroutine it sees running for 10 ms.
				runtime.Gosched()
				r.yielded = now
			}
		case len(r.owned) > 0:
			n, err = sockfd.EpollWaitFor(lp.epfd, r.events[:], 0)
		default:
			n, err = sockfd.EpollWaitBlocking(lp.epfd, r.events[:])
		}
		lp.waits.Add(1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || lp.closing.Load() {
			break
		}
		for i := range n {
			lp.dispatch(r.events[i], r)
			seamAt(seamBatch, nil)
		}
	}
	if r.raw {
		rawSlots.give()
	}
	sockfd.Close(lp.wake)
	sockfd.Close(lp.epfd)
	close(lp.done)
}

// rawSlots bounds the loops that hold a P in a raw wait at once to one
// fewer than GOMAXPROCS (reserveP), so that a P is always left for every
// other goroutine: a loop that finds no slot waits as a blocking syscall.
var rawSlots rawSlotCount

type rawSlotCount struct{ held, max atomic.Int32 }

func (r *rawSlotCount) take() bool {
	for {
		h := r.held.Load()
		if h >= r.max.Load() {
			return false
		}
		if r.held.CompareAndSwap(h, h+1) {
			return true
		}
	}
}

func (r *rawSlotCount) give() { r.held.Add(-1) }

var (
	procsMu   sync.Mutex
	procsBase int // GOMAXPROCS as the process set it, before reserveP: the default count of loops
)

// loopProcs is the default count of a Server's loops: one per P as the
// process set them (fulcrum: one per CPU it may use, or [process] loops;
// procs.go), not counting the P reserveP adds.
func loopProcs() int {
	procsMu.Lock()
	defer procsMu.Unlock()
	if procsBase == 0 {
		procsBase = runtime.GOMAXPROCS(0)
	}
	return procsBase
}

// reserveP makes room for n loops each holding a P in its raw wait and one
// P more for everything else, raising GOMAXPROCS if need be: a P a loop
// holds while idle is handed back (run), so the extra P costs nothing
// while there is nothing for it to do.
func reserveP(n int) {
	procsMu.Lock()
	defer procsMu.Unlock()
	if procsBase == 0 {
		procsBase = runtime.GOMAXPROCS(0)
	}
	p := runtime.GOMAXPROCS(0)
	if p < n+1 {
		runtime.GOMAXPROCS(n + 1)
		p = n + 1
	}
	rawSlots.max.Store(int32(p - 1))
}

// dispatch wakes the directions an event concerns: the one reading the
// socket on input, hang-up or error; the one writing it on output if it
// wants output, or on hang-up or error. An event for a socket not in a
// session wakes the goroutine awaiting it, if any.
func (lp *loop) dispatch(ev unix.EpollEvent, r *loopRun) {
	fd := int(ev.Fd)
	if ev.Pad == acceptTag { // a listening socket: accept after the batch, if no other loop does
		if a := (*lp.accs.Load())[ev.Fd]; a != nil && a.kick() {
			r.owned = append(r.owned, a)
		}
		return
	}
	if fd < 0 || fd >= len(lp.tab) { // wakeTag included
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

// acceptTag marks a listening socket's registration (watch), in the
// event's data beside the descriptor: a session's socket never has it, so
// an event left from a listening socket closed meanwhile never kicks the
// session whose socket took its number.
const acceptTag = 1

// watch adds listening socket a to the loop's epoll: edge-triggered, and
// exclusive, so that a connection wakes one waiting loop, not every one.
func (lp *loop) watch(a *acceptor) error {
	lp.accMu.Lock()
	defer lp.accMu.Unlock()
	old := *lp.accs.Load()
	m := make(map[int32]*acceptor, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[int32(a.fd)] = a
	lp.accs.Store(&m) // before the registration, which may report a connection at once
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET | unix.EPOLLEXCLUSIVE, Fd: int32(a.fd), Pad: acceptTag}
	if err := sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_ADD, a.fd, &ev); err != nil {
		lp.accs.Store(&old)
		return err
	}
	return nil
}

// unwatch takes listening socket a out of the loop's epoll. Its descriptor
// must stay open until it is: an epoll watches an open file, not a number,
// and the registration would outlive the close while another descriptor
// for the file stays open (a binary upgrade's, systemd's).
func (lp *loop) unwatch(a *acceptor) {
	lp.accMu.Lock()
	defer lp.accMu.Unlock()
	old := *lp.accs.Load()
	if old[int32(a.fd)] != a {
		return
	}
	sockfd.EpollCtl(lp.epfd, unix.EPOLL_CTL_DEL, a.fd, nil)
	m := make(map[int32]*acceptor, len(old))
	for k, v := range old {
		if v != a {
			m[k] = v
		}
	}
	lp.accs.Store(&m)
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
