package listener

// Sockets as raw descriptors: the accept and dial primitives of the event
// loops, which keep every proxied socket out of Go's poller (loop.go), and
// the bridge back to a *net.TCPConn for the rare path that wants one.

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

// dial connects to a backend of a service of policy pol: a non-blocking
// connect on a raw socket with TCP_NODELAY, pol's keepalive and user
// timeout, from client's address when pol says so (pol.SourceClient,
// transparent.go), then a wait of at most pol.ConnectTimeout (0: none) for
// its outcome. A connect that is not done
// at once (always so but on loopback) waits in an event loop's epoll, never
// in a thread of its own; before it waits, i (if not nil) is handed off.
func (s *Server) dial(pol *Policy, a netip.AddrPort, client netip.Addr, i *inline) (int, error) {
	fd, err := s.connectRaw(pol, a, client, i)
	if err != nil {
		return -1, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(a), Err: err}
	}
	return fd, nil
}

func (s *Server) connectRaw(pol *Policy, a netip.AddrPort, client netip.Addr, i *inline) (int, error) {
	family := unix.AF_INET
	if !a.Addr().Unmap().Is4() {
		family = unix.AF_INET6
	}
	fd, err := sockfd.Socket(family)
	if err != nil {
		return -1, err
	}
	if err := setDialOpts(fd, pol); err != nil {
		sockfd.Close(fd)
		return -1, err
	}
	if pol.SourceClient {
		if err := bindClient(fd, client, a); err != nil {
			sockfd.Close(fd)
			return -1, err
		}
	}
	switch err := sockfd.Connect(fd, a); err {
	case nil:
		return fd, nil
	case unix.EINPROGRESS, unix.EALREADY:
	default:
		sockfd.Close(fd)
		return -1, err
	}
	switch writable(fd) {
	case connUp:
		return fd, nil
	case connPending:
		s.handOff(i)
		if err := s.awaitConnect(fd, pol.ConnectTimeout); err != nil {
			sockfd.Close(fd)
			return -1, err
		}
	}
	if err := sockfd.ConnectError(fd); err != nil {
		sockfd.Close(fd)
		return -1, err
	}
	return fd, nil
}

// connState is what a connect in progress has come to.
type connState uint8

const (
	connPending connState = iota // no outcome yet
	connUp                       // established
	connFailed                   // failed: SO_ERROR says why
)

// writable tells whether fd's connect has an outcome: on loopback it has
// by the time connect returns, whose backlog is processed before it does.
// Writable without error or hang-up is up, with no SO_ERROR to ask.
func writable(fd int) connState {
	switch ev := sockfd.Poll(fd, unix.POLLOUT); {
	case ev == 0:
		return connPending
	case ev&(unix.POLLERR|unix.POLLHUP) != 0:
		return connFailed
	}
	return connUp
}

// awaitConnect waits until fd, a connect in progress, is writable (the
// connection is up or failed) or timeout passes, in one of s's loops. The
// session later registers fd again for its own events, in whichever loop it
// runs.
//
// A wake-up is looked at again (writable): an event harvested in a batch
// for an earlier use of fd's number, closed meanwhile and its number given
// to this socket, wakes the wait as well, and SO_ERROR is 0 in SYN_SENT.
// While the connect is still in progress it waits again, in the same loop,
// to the same deadline.
func (s *Server) awaitConnect(fd int, timeout time.Duration) error {
	lp, err := s.loop()
	if err != nil {
		return err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	registered := false
	for {
		if err := lp.await(fd, unix.EPOLLOUT, deadline, &registered); err != nil {
			return err
		}
		if writable(fd) != connPending {
			return nil
		}
	}
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

// setDialOpts gives a new socket to be connected what a Go net.Conn has
// (TCP_NODELAY), SO_OOBINLINE (a backend's urgent byte stays in the stream,
// as a client's does: setNoDelay), pol's keepalive, and its user timeout,
// set before the connect so that it bounds the handshake's retransmissions
// too. What a new socket has already (keepalive off, the kernel's user
// timeout) is not set again.
func setDialOpts(fd int, pol *Policy) error {
	if err := sockfd.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return err
	}
	if err := sockfd.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil {
		return err
	}
	if ka := keepAliveFor(pol); ka.Idle > 0 { // a new socket has it off
		if err := setKeepAliveFD(fd, ka); err != nil {
			return err
		}
	}
	return setUserTimeoutFD(fd, pol.UserTimeout)
}

// setUserTimeoutFD sets TCP_USER_TIMEOUT on fd (usertimeout.go); d <= 0
// leaves it unset.
func setUserTimeoutFD(fd int, d time.Duration) error {
	if set := userTimeout(d); set != nil {
		return set("", "", fdRawConn(fd))
	}
	return nil
}

// fdRawConn is a raw descriptor as a syscall.RawConn, for the option
// setters written for one; it can only Control.
type fdRawConn int

func (c fdRawConn) Control(f func(fd uintptr)) error       { f(uintptr(c)); return nil }
func (fdRawConn) Read(func(fd uintptr) (done bool)) error  { return errors.ErrUnsupported }
func (fdRawConn) Write(func(fd uintptr) (done bool)) error { return errors.ErrUnsupported }

// fdWriter writes to a connected non-blocking socket that can take what is
// written at once (the PROXY header into a fresh connection); a full socket
// is an error, not a wait.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := sockfd.Send(int(w), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}
