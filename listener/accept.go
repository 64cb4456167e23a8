package listener

// Accepting: each listening socket's accept loop takes connections with
// accept4 as raw non-blocking descriptors, which only an event loop's epoll
// will watch, and serves each inline (handle, admit.go) until serving it
// would wait; the connection then detaches from the loop's goroutine and a
// new one takes the loop over (detach).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// acceptor is a socket's accept loop: what it knows moves with it when a
// connection it serves inline detaches from it (detach).
type acceptor struct {
	so *socket
	in inheritance // the keepalive accepted sockets inherit (keepalive.go)
}

// inline is a connection served in its accept loop's goroutine. At the
// first point where serving it would wait (a PROXY header, a name to route
// by, a queue, a hold, a connect not done at once), detach starts another
// goroutine for the loop, and this one goes on as the connection's alone.
// A connection that waits for nothing (a backend that answers its connect
// at once, as on loopback or a LAN) costs no goroutine and no wake-up of
// another thread: accept, pick, connect and the session's registration in
// its event loop are one run, as in nginx's worker.
type inline struct {
	a    *acceptor
	gone bool // detached: the loop runs in another goroutine now
}

// detach gives the accept loop to a new goroutine, if i still has it; a
// nil i (a connection served in a goroutine of its own) has nothing to give.
func (s *Server) detach(i *inline) {
	if i == nil || i.gone {
		return
	}
	i.gone = true
	go s.accept(i.a) // the loop's count in s.wg moves with it
}

// accept runs a socket's accept loop until the socket is closed or retired,
// then ends it, unless a connection it served handed the loop on.
func (s *Server) accept(a *acceptor) {
	so := a.so
	held := false // a slot of the limit taken for the next connection (acceptRaw)
	if s.acceptLoop(a, &held) {
		return
	}
	if held {
		<-s.slots
	}
	so.acc.Close()
	close(so.exited)
	s.wg.Done()
}

// acceptLoop accepts and serves connections. Temporary failures (EMFILE,
// ENFILE, ECONNABORTED, ENOBUFS…) back off from 5 ms, doubling to 1 s, and
// never end the loop; only closing or retiring the socket does. With a
// heartbeat set, Accept wakes on a deadline so that the loop answers Alive
// even when no client comes. It reports whether it handed the loop on.
func (s *Server) acceptLoop(a *acceptor, held *bool) (detached bool) {
	so := a.so
	var delay time.Duration
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	acc, rc := so.acc, so.rc
	emptied := false // acceptRaw's closure shares it: one allocation per loop, not per accept
	for {
		if s.acceptHook != nil {
			s.acceptHook()
		}
		if d := time.Duration(s.beat.Load()); d > 0 {
			acc.SetReadDeadline(time.Now().Add(d))
		}
		select { // after the deadline: retire closes done, then sets a deadline in the past
		case <-so.done:
			return false
		default:
		}
		s.inherit(&a.in, rc, so.key)
		emptied = false
		fd, peer, err := acceptRaw(rc, &emptied, s.slots, held)
		so.beat.Store(time.Now().UnixNano())
		if errors.Is(err, errAtLimit) { // a client waits, every slot is taken: wait for one
			if !s.takeSlot(so) {
				return false
			}
			*held = true
			continue
		}
		if err == nil {
			*held = false // the connection's now: connDone gives it back
			delay = 0
			s.admitting.begin() // before the count a test awaits, and before the connection can detach: Close waits for it (handle ends it)
			so.accepts.Add(1)
			s.wg.Add(1)
			i := inline{a: a}
			s.handle(fd, peer, so.key, a.in.accepted(emptied), &i) // its slot is freed by connDone
			if i.gone {
				return true
			}
			continue
		}
		select {
		case <-so.done:
			return false
		default:
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue // the heartbeat
		}
		if errors.Is(err, net.ErrClosed) {
			return false
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
			return false
		case <-t.C:
		}
	}
}

// acceptConn returns ln's socket as a *net.TCPConn on a duplicate
// descriptor, and its RawConn, whose Read can wait for the socket to be
// readable (a pending connection) where a listener's cannot. TCP_NODELAY,
// which accepted sockets inherit, is set again: Go sets it on such a conn
// too, but that is its business, and an inherited socket may lack it.
func acceptConn(ln *net.TCPListener) (*net.TCPConn, syscall.RawConn, error) {
	f, err := ln.File()
	if err != nil {
		return nil, nil, err
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, nil, fmt.Errorf("listening socket as a conn: %T", c)
	}
	rc, err := tc.SyscallConn()
	if err == nil {
		err = setNoDelay(rc)
	}
	if err != nil {
		tc.Close()
		return nil, nil, err
	}
	return tc, rc, nil
}

// acceptRaw accepts one connection from ln with accept4, non-blocking and
// close-on-exec, waiting in Go's poller (which watches the listening socket,
// with its deadline) while there is none; it sets *emptied if it found the
// queue empty first.
//
// A connection needs a slot of the Server's limit, taken only once the
// socket is readable: a listener waiting for clients holds none, so every
// slot is there for the listeners that have some. *held says whether the
// caller holds a slot (one it waited for in takeSlot) and on return whether
// it still does: a connection accepted keeps it, a queue found empty gives
// it back. When a client waits and no slot is free, acceptRaw returns
// errAtLimit without accepting.
func acceptRaw(rc syscall.RawConn, emptied *bool, slots chan struct{}, held *bool) (int, netip.AddrPort, error) {
	fd := -1
	var peer netip.AddrPort
	var aerr error
	atLimit := false
	err := rc.Read(func(lfd uintptr) bool {
		for {
			if !*held {
				select {
				case slots <- struct{}{}:
					*held = true
				default:
					atLimit = true
					return true
				}
			}
			var e error
			fd, peer, e = sockfd.Accept4(int(lfd))
			aerr = e
			if e == unix.EINTR {
				continue
			}
			if e != nil { // the queue was empty, or an error: no connection takes the slot
				<-slots
				*held = false
			}
			if e == unix.EAGAIN {
				*emptied = true
			}
			return e != unix.EAGAIN
		}
	})
	if err == nil && atLimit {
		return -1, netip.AddrPort{}, errAtLimit
	}
	if err == nil {
		err = aerr
	}
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	return fd, peer, nil
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
