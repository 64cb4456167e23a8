package listener

// Accepting: a listening socket is a raw non-blocking descriptor that every
// event loop's epoll watches (edge-triggered, EPOLLEXCLUSIVE), and that Go's
// poller does not. The loop whose wait a connection wakes accepts it with
// accept4 and serves it inline, in the loop's own goroutine and thread
// (handle, admit.go), until serving it would wait; the connection then
// detaches, and a new goroutine takes the event loop over (detach). A
// connection whose backend answers its connect at once (loopback, a LAN
// whose SYN-ACK is in by the time it is asked) costs no goroutine and wakes
// no other thread: readiness, accept, pick, connect and the session's
// registration are one run of the loop, as in nginx's worker.
//
// Each socket also has a goroutine of its own, its accept goroutine, for
// what a loop must not wait for: at the connection limit it waits for a
// slot (takeSlot), after an accept error it backs off (5 ms, doubling to 1
// s), and with a heartbeat set it wakes that often to accept, so that Alive
// tells a live accept path from a stuck one. It also ends the socket.
//
// Who accepts is one owner at a time, by the socket's state (parked,
// running, kicked, done; compare-and-swap, as a direction's in loop.go): an
// event on a parked socket makes its loop the owner; an event while
// another owns it marks it kicked, and the owner, finding the queue empty,
// accepts again instead of parking, so no connection is left queued behind
// an edge already taken. The owner hands the socket to its accept goroutine
// (own) at the limit, after an error and when the socket is retired.

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// acceptor is a socket's accept path: its owner's state, and what the
// owner knows, which moves with the ownership.
type acceptor struct {
	s     *Server
	so    *socket
	fd    int           // the listening socket, a raw duplicate in no poller but the loops' epolls
	state atomic.Int32  // stParked, stRunning, stKicked, stDone (loop.go); starts running: its goroutine's
	own   chan struct{} // a loop hands the socket to its accept goroutine
	poke  chan struct{} // SetHeartbeat: the accept goroutine looks at the heartbeat again
	why   error         // set by a loop before it hands over for an accept error: the goroutine's to report
	in    inheritance   // the keepalive accepted sockets inherit (keepalive.go); the owner's
}

// acceptBatch is how many connections a loop accepts from one socket per
// wake-up before it serves its other events; it accepts the rest after
// its next wait, which then does not block.
const acceptBatch = 16

// kick makes the caller, a loop with an event for the socket, its owner if
// it is parked (true: the caller drains it); if another owns it, that owner
// accepts again before it parks.
func (a *acceptor) kick() bool {
	for {
		switch a.state.Load() {
		case stParked:
			if a.state.CompareAndSwap(stParked, stRunning) {
				return true
			}
		case stRunning:
			if a.state.CompareAndSwap(stRunning, stKicked) {
				return false
			}
		default: // kicked already, or done
			return false
		}
	}
}

// park gives the socket up after its queue was found empty; false: an
// event came meanwhile, and the caller, still the owner, accepts again.
func (a *acceptor) park() bool {
	if a.state.CompareAndSwap(stRunning, stParked) {
		return true
	}
	a.state.Store(stRunning) // kicked
	return false
}

// handOff gives the socket's ownership to its accept goroutine, with the
// accept error it is to report, if any.
func (a *acceptor) handOff(why error) {
	a.why = why
	a.own <- struct{}{} // never blocks: one owner, and the goroutine is not it
}

// inline is a connection served where it was accepted: in an event loop's
// goroutine (lp and run set) or in its socket's accept goroutine. At the
// first point where serving it would wait (a PROXY header, a name to route
// by, a queue, a hold, a connect not done at once), detach starts another
// goroutine to go on with what this one was doing, and this one goes on as
// the connection's alone.
type inline struct {
	a    *acceptor
	lp   *loop
	run  *loopRun
	gone bool // detached: the loop, or the accept goroutine, runs in another goroutine now
}

// detach hands what i's goroutine was doing on to a new goroutine, if i
// still has it; a nil i (a connection served in a goroutine of its own)
// has nothing to give.
func (s *Server) detach(i *inline) {
	if i == nil || i.gone {
		return
	}
	i.gone = true
	if i.lp != nil {
		go i.lp.run(i.run) // the event loop, which owns the socket still (run.owned)
		return
	}
	go s.accept(i.a, true) // the socket's accept goroutine, owning the socket; its count in s.wg moves with it
}

// acceptNext accepts a's next connection, once the owner's hook has run and the
// listening socket has its service's keepalive: the connection's socket,
// its client, or errAtLimit, EAGAIN (the queue is empty) or an error.
// *held: see acceptRaw.
func (s *Server) acceptNext(a *acceptor, held *bool) (int, netip.AddrPort, error) {
	if s.acceptHook != nil {
		s.acceptHook()
	}
	s.inherit(&a.in, a.fd, a.so.key)
	fd, peer, err := acceptRaw(a.fd, s.slots, held)
	if err == unix.EAGAIN {
		a.in.empty()
	}
	a.so.beat.Store(time.Now().UnixNano())
	return fd, peer, err
}

// serve admits connection fd, accepted by i's goroutine, and starts its
// session or ends it (handle).
func (s *Server) serve(a *acceptor, fd int, peer netip.AddrPort, i *inline) {
	s.admitting.begin() // before the count a test awaits, and before the connection can detach: Close waits for it (handle ends it)
	a.so.accepts.Add(1)
	s.wg.Add(1)
	s.handle(fd, peer, a.so.key, a.in.accepted(), i) // its slot is freed by connDone
}

// drainIn accepts and serves a's connections in loop lp's goroutine, which
// owns a, for at most acceptBatch of them. It reports whether it gave a up
// (parked, or handed to its accept goroutine) and whether a connection
// detached lp's goroutine, which then owns a no more: another goroutine
// runs lp (and drains a) now.
func (s *Server) drainIn(a *acceptor, lp *loop, run *loopRun) (released, detached bool) {
	for range acceptBatch {
		select {
		case <-a.so.done:
			a.handOff(nil)
			return true, false
		default:
		}
		held := false
		var fd int
		var peer netip.AddrPort
		err := seamAt(seamLoopAccept, nil)
		if err == nil {
			fd, peer, err = s.acceptNext(a, &held)
		}
		switch {
		case err == nil:
			i := inline{a: a, lp: lp, run: run}
			s.serve(a, fd, peer, &i)
			if i.gone {
				return false, true
			}
		case err == unix.EAGAIN:
			seamAt(seamAcceptEmpty, nil)
			if a.park() {
				select {
				case <-a.so.done: // retired meanwhile: its goroutine may be waiting for the owner (endSocket)
					if a.state.CompareAndSwap(stParked, stRunning) {
						a.handOff(nil)
					}
				default:
				}
				return true, false
			}
		case errors.Is(err, errAtLimit):
			a.handOff(nil) // its goroutine waits for a slot
			return true, false
		default:
			a.handOff(err) // its goroutine reports it and backs off
			return true, false
		}
	}
	return false, false
}

// accept is a socket's accept goroutine (the package comment): owned says
// whether it starts as the socket's owner, as it does when Commit starts it
// and when a connection it served detached. It ends the socket once it is
// retired, unless a connection it served handed it on.
func (s *Server) accept(a *acceptor, owned bool) {
	so := a.so
	held := false // a slot of the limit taken for the next connection (acceptRaw)
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		if owned {
			why := a.why
			a.why = nil
			switch s.drainHere(a, &held, why) {
			case drainDetached:
				return
			case drainParked:
				owned = false
			case drainRetired:
				s.endSocket(a, true, held)
				return
			}
		}
		var beat <-chan time.Time
		if d := time.Duration(s.beat.Load()); d > 0 {
			if t == nil {
				t = time.NewTimer(d)
			} else {
				t.Reset(d)
			}
			beat = t.C
		}
		select {
		case <-a.own:
			owned = true
		case <-so.done:
			s.endSocket(a, false, held)
			return
		case <-a.poke:
		case <-beat:
			// The heartbeat: accept, as the loops do, unless one of them
			// is the owner, which answers as it accepts.
			owned = a.state.CompareAndSwap(stParked, stRunning)
		}
	}
}

// drainHere's outcomes.
const (
	drainParked   = iota // the queue was empty: a is parked
	drainDetached        // a connection served detached: another goroutine owns a
	drainRetired         // the socket was retired: the caller owns a still
)

// drainHere accepts and serves a's connections in its accept goroutine,
// which owns a, until the queue is empty, reporting why (an error a loop
// handed over with it) first. Temporary failures (EMFILE, ENFILE,
// ECONNABORTED, ENOBUFS…) back off from 5 ms, doubling to 1 s; at the
// connection limit it waits for a slot (takeSlot). *held: see acceptRaw.
func (s *Server) drainHere(a *acceptor, held *bool, why error) int {
	so := a.so
	var delay time.Duration
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		select {
		case <-so.done:
			return drainRetired
		default:
		}
		err := why
		if why == nil {
			var fd int
			var peer netip.AddrPort
			fd, peer, err = s.acceptNext(a, held)
			if err == nil {
				*held = false // the connection's now: connDone gives it back
				delay = 0
				i := inline{a: a}
				s.serve(a, fd, peer, &i)
				if i.gone {
					return drainDetached
				}
				continue
			}
		}
		why = nil
		switch {
		case err == unix.EAGAIN:
			if a.park() {
				return drainParked
			}
			continue
		case errors.Is(err, errAtLimit): // a client waits, every slot is taken: wait for one
			if !s.takeSlot(so) {
				return drainRetired
			}
			*held = true
			continue
		}
		so.errors.Add(1)
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		so.beat.Store(time.Now().Add(delay).UnixNano()) // backing off is alive, for as long as the wait
		s.log.Warn().Err(err).Stringer("listen", so.key).Dur("retry_in", delay).Msg("accept failed")
		if t == nil {
			t = time.NewTimer(delay)
		} else {
			t.Reset(delay)
		}
		select {
		case <-so.done:
			return drainRetired
		case <-t.C:
		}
	}
}

// endSocket ends retired socket a in its accept goroutine, which owns it
// or not: first no loop watches it any more; then the goroutine takes it
// from its owner, if a loop owns it (the loop hands it over when it sees
// the socket retired, or, having parked it just before, takes it back to
// hand it over: drainIn), and marks it done. The order matters: a loop may
// hold an event for it in the batch it is dispatching, and the descriptor,
// which retire then closes, must not be closed, nor its number reused,
// while a loop can still act on that event.
func (s *Server) endSocket(a *acceptor, owned, held bool) {
	if lps := s.lps.Load(); lps != nil {
		a.so.unwatch(lps)
	}
	if !owned && !a.state.CompareAndSwap(stParked, stDone) {
		seamAt(seamAcceptWaitOwner, nil)
		<-a.own
	}
	a.state.Store(stDone)
	if held {
		<-s.slots
	}
	close(a.so.exited) // retire closes the socket, or keeps it among the spares

	s.wg.Done()
}

// acceptRaw accepts one connection from listening socket lfd with accept4,
// non-blocking and close-on-exec, or returns EAGAIN when none is queued.
//
// A connection needs a slot of the Server's limit, taken before the
// accept4 and given back if it finds none. *held says whether the caller
// holds a slot (one it waited for in takeSlot) and on return whether it
// still does: a connection accepted keeps it, a queue found empty gives it
// back. When no slot is free, acceptRaw returns errAtLimit without
// accepting.
func acceptRaw(lfd int, slots chan struct{}, held *bool) (int, netip.AddrPort, error) {
	for {
		if !*held {
			select {
			case slots <- struct{}{}:
				*held = true
			default:
				return -1, netip.AddrPort{}, errAtLimit
			}
		}
		fd, peer, err := sockfd.Accept4(lfd)
		if err == nil {
			return fd, peer, nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		<-slots // the queue was empty, or an error: no connection takes the slot
		*held = false
		if errors.Is(err, unix.EAGAIN) {
			return -1, netip.AddrPort{}, unix.EAGAIN
		}
		return -1, netip.AddrPort{}, err
	}
}

// errAtLimit: a client waits to be accepted and the Server's connection
// limit is reached.
var errAtLimit = errors.New("at the connection limit")

// localAddr is the address a client connected to (getsockname): asked only
// when the listening address does not say it (a wildcard or port 0).
func localAddr(fd int, listen netip.AddrPort) netip.AddrPort {
	if !listen.Addr().IsUnspecified() && listen.Port() != 0 {
		return listen
	}
	a, err := sockfd.LocalAddr(fd)
	if err != nil {
		return listen
	}
	return a
}
