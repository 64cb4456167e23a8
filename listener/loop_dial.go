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
	"unsafe"

	"golang.org/x/sys/unix"
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
// queue empty first. The client's address comes from accept4's own result,
// read here: unix.Accept4 would ask the socket its protocol (one getsockopt
// per connection) to tell L2TP from TCP.
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
	var rsa unix.RawSockaddrAny
	var aerr syscall.Errno
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
			n := uint32(unix.SizeofSockaddrAny)
			r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, lfd, uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
				unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
			fd, aerr = int(r), e
			if e == unix.EINTR {
				continue
			}
			if e != 0 { // the queue was empty, or an error: no connection takes the slot
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
	if err == nil && aerr != 0 {
		err = os.NewSyscallError("accept4", aerr)
	}
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	return fd, rawAddrPort(&rsa), nil
}

// errAtLimit: a client waits to be accepted and the Server's connection
// limit is reached.
var errAtLimit = errors.New("at the connection limit")

// rawAddrPort is the IPv4 or IPv6 address in rsa.
func rawAddrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		a := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&a.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		a := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&a.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// localAddr is the address a client connected to (getsockname): asked only
// when the listening address does not say it (a wildcard or port 0).
func localAddr(fd int, listen netip.AddrPort) netip.AddrPort {
	if !listen.Addr().IsUnspecified() && listen.Port() != 0 {
		return listen
	}
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)))
	if e != 0 {
		return listen
	}
	return rawAddrPort(&rsa)
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
	fd, err := socketFD(family)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err := setDialOpts(fd, pol); err != nil {
		closeFD(fd)
		return -1, err
	}
	if pol.SourceClient {
		if err := bindClient(fd, client, a); err != nil {
			closeFD(fd)
			return -1, err
		}
	}
	switch err := connectFD(fd, a); err {
	case nil:
		return fd, nil
	case unix.EINPROGRESS, unix.EALREADY:
	default:
		closeFD(fd)
		return -1, os.NewSyscallError("connect", err)
	}
	switch writable(fd) {
	case connUp:
		return fd, nil
	case connPending:
		s.handOff(i)
		if err := s.awaitConnect(fd, pol.ConnectTimeout); err != nil {
			closeFD(fd)
			return -1, err
		}
	}
	if e, err := getsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
		closeFD(fd)
		if err == nil {
			err = syscall.Errno(e)
		}
		return -1, os.NewSyscallError("connect", err)
	}
	return fd, nil
}

// What a connect in progress has come to.
const (
	connPending = iota // no outcome yet
	connUp             // established
	connFailed         // failed: SO_ERROR says why
)

// writable tells whether fd's connect has an outcome: on loopback it has
// by the time connect returns, whose backlog is processed before it does.
// Writable without error or hang-up is up, with no SO_ERROR to ask.
func writable(fd int) int {
	pfd := unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	var ts unix.Timespec
	n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	switch {
	case e != 0 || n == 0:
		return connPending
	case pfd.Revents&(unix.POLLERR|unix.POLLHUP) != 0:
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
	if err := epollCtl(lp.epfd, op, fd, &ev); err != nil {
		lp.wait[fd].CompareAndSwap(w, nil)
		return os.NewSyscallError("epoll_ctl", err)
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
	if err := setsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	if err := setsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil {
		return os.NewSyscallError("setsockopt", err)
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

// goConn returns a *net.TCPConn on a duplicate of fd, in Go's poller, for
// code that reads with deadlines (the PROXY header); closing it leaves fd
// open and out of Go's poller. It costs a few syscalls, on that path only.
func goConn(fd int) (*net.TCPConn, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(nfd), "")
	c, err := net.FileConn(f) // another duplicate; f's is closed next
	f.Close()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("not a TCP socket: %T", c)
	}
	return tc, nil
}

// fdWriter writes to a connected non-blocking socket that can take what is
// written at once (the PROXY header into a fresh connection); a full socket
// is an error, not a wait.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := send(int(w), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, os.NewSyscallError("send", err)
		}
		n += k
	}
	return n, nil
}

// The per-connection syscalls, raw: on non-blocking sockets without
// SO_LINGER none of them blocks, and the runtime's entersyscall around each
// would cost more than the call (and wake sysmon when the process was idle).

func closeFD(fd int) {
	unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

func shutdownFD(fd, how int) {
	unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), uintptr(how), 0) // ENOTCONN after a reset: nothing to do
}

func setsockoptInt(fd, level, opt, v int) error {
	v32 := int32(v)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v32)), 4, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockoptInt(fd, level, opt int) (int, error) {
	var v int32
	n := uint32(4)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, e
	}
	return int(v), nil
}

func socketFD(family int) (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// connectFD starts a connect to a from a non-blocking socket.
func connectFD(fd int, a netip.AddrPort) error {
	var rsa unix.RawSockaddrAny
	var n uintptr
	port := a.Port()
	if ip := a.Addr().Unmap(); ip.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rsa))
		sa.Family = unix.AF_INET
		sa.Addr = ip.As4()
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		n = unix.SizeofSockaddrInet4
	} else {
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&rsa))
		sa.Family = unix.AF_INET6
		sa.Addr = ip.As16()
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		n = unix.SizeofSockaddrInet6
	}
	for {
		_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), n)
		if e != unix.EINTR {
			if e != 0 {
				return e
			}
			return nil
		}
	}
}
