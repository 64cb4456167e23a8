//go:build linux

// Package sockfd is every system call fulcrum's data path makes on a raw
// descriptor: accept4, socket, bind, connect, the socket options, read,
// send, splice, pipes, peeks and polls, and the epoll calls of the event
// loops (listener/loop.go). It is Linux-only, as fulcrum is: nothing else
// in the tree makes a system call on a socket by itself.
//
// The calls that move bytes or wait for nothing are made raw
// (unix.RawSyscall, no entersyscall): on non-blocking sockets without
// SO_LINGER none of them blocks, and the runtime's bookkeeping around a
// syscall would cost more than the call (and wake sysmon when the process
// was idle). Each function is small enough to be inlined, and none
// allocates but on a failure.
//
// Errors are wrapped here, once, and nowhere above: a failure is an
// *os.SyscallError naming the call, except the answers callers act on
// ("not yet", "already"), which come back as the bare unix.Errno so that
// telling them costs one comparison and no allocation: EAGAIN and EINTR
// from every call, EINPROGRESS and EALREADY from Connect, EEXIST from
// EpollCtl. errors.Is finds the errno inside either.
//
// Typical use (listener/xfer.go):
//
//	n, err := sockfd.Read(fd, buf)
//	if err == unix.EAGAIN { /* park until the next edge */ }
package sockfd

import (
	"errors"
	"net/netip"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fail is the one place an errno becomes an error (see the package
// comment). Returns: e itself for the answers callers compare, else an
// *os.SyscallError naming call.
func fail(call string, e unix.Errno) error {
	switch e {
	case unix.EAGAIN, unix.EINTR, unix.EINPROGRESS, unix.EALREADY, unix.EEXIST:
		return e
	}
	return os.NewSyscallError(call, e)
}

// Read is read(2) on non-blocking fd into p (not empty).
// Returns: the bytes read, 0 at EOF; unix.EAGAIN when fd has none.
func Read(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, fail("read", e)
	}
	return int(n), nil
}

// Send is send(2) of p (not empty) on fd with MSG_NOSIGNAL (a peer that
// has reset gives EPIPE, not a SIGPIPE to be ignored) and MSG_DONTWAIT (it
// never blocks). Returns: the bytes sent; unix.EAGAIN when fd's send
// buffer is full.
func Send(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, fail("send", e)
	}
	return int(n), nil
}

// Splice moves up to n bytes from in to out (one of them a pipe) without
// blocking on the pipe side; a socket side never blocks since every socket
// is O_NONBLOCK. An interrupted call is made again. Returns: the bytes
// moved, 0 at the socket's EOF (or an urgent mark: listener/xfer.go);
// unix.EAGAIN when the source is empty or the destination full.
func Splice(in, out, n int) (int, error) {
	for {
		k, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, fail("splice", e)
		}
		return int(k), nil
	}
}

// RecvPeek peeks at what socket fd holds (MSG_PEEK|MSG_DONTWAIT), without
// waiting. Returns: the bytes peeked into buf (not empty), 0 when the peer
// has closed with nothing pending; unix.EAGAIN when nothing has come.
func RecvPeek(fd int, buf []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, fail("recvfrom", e)
	}
	return int(n), nil
}

// Close closes fd; its error is of no use to a caller that is done with
// it (close(2) releases the descriptor whatever it says).
func Close(fd int) {
	unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

// Shutdown shuts socket fd down for how (unix.SHUT_WR, unix.SHUT_RDWR).
// Its error is ignored: ENOTCONN after a reset leaves nothing to do.
func Shutdown(fd, how int) {
	unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), uintptr(how), 0)
}

// SetsockoptInt sets an int option on fd. Returns: nil, or the
// *os.SyscallError of setsockopt.
func SetsockoptInt(fd, level, opt, v int) error {
	v32 := int32(v)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v32)), 4, 0)
	if e != 0 {
		return fail("setsockopt", e)
	}
	return nil
}

// GetsockoptInt reads an int option of fd. Returns: its value, or the
// *os.SyscallError of getsockopt.
func GetsockoptInt(fd, level, opt int) (int, error) {
	var v int32
	n := uint32(4)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, fail("getsockopt", e)
	}
	return int(v), nil
}

// ConnectError asks socket fd, whose connect has an outcome, what it was
// (SO_ERROR). Returns: nil when it connected, else the *os.SyscallError of
// the connect (or of the getsockopt that asked).
func ConnectError(fd int) error {
	e, err := GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if e != 0 {
		return os.NewSyscallError("connect", unix.Errno(e))
	}
	return nil
}

// Socket makes a TCP socket of family (unix.AF_INET, unix.AF_INET6),
// non-blocking and close-on-exec. Returns: its descriptor, or the
// *os.SyscallError of socket.
func Socket(family int) (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return -1, fail("socket", e)
	}
	return int(fd), nil
}

// sockaddr writes a into rsa. Returns: the length of the address written.
func sockaddr(rsa *unix.RawSockaddrAny, a netip.AddrPort) uintptr {
	port := a.Port()
	if ip := a.Addr().Unmap(); ip.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		sa.Family = unix.AF_INET
		sa.Addr = ip.As4()
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		return unix.SizeofSockaddrInet4
	}
	sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
	sa.Family = unix.AF_INET6
	sa.Addr = a.Addr().As16()
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	return unix.SizeofSockaddrInet6
}

// Connect starts a connect of non-blocking socket fd to a; an interrupted
// call is made again. Returns: nil when connected at once; unix.EINPROGRESS
// (or unix.EALREADY) when the outcome is to be awaited (Writable); else
// the *os.SyscallError of connect.
func Connect(fd int, a netip.AddrPort) error {
	var rsa unix.RawSockaddrAny
	n := sockaddr(&rsa, a)
	for {
		_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), n)
		switch e {
		case unix.EINTR:
			continue
		case 0:
			return nil
		}
		return fail("connect", e)
	}
}

// Bind binds socket fd to a (port 0: chosen at connect). Returns: nil, or
// the *os.SyscallError of bind.
func Bind(fd int, a netip.AddrPort) error {
	var rsa unix.RawSockaddrAny
	n := sockaddr(&rsa, a)
	if _, _, e := unix.RawSyscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), n); e != 0 {
		return fail("bind", e)
	}
	return nil
}

// Accept4 accepts one connection from listening socket lfd, non-blocking
// and close-on-exec. The client's address comes from accept4's own result:
// unix.Accept4 would ask the socket its protocol (one getsockopt per
// connection) to tell L2TP from TCP. Returns: the new socket and the
// client's address (IPv4-mapped addresses unmapped); unix.EAGAIN when no
// connection is pending, unix.EINTR when interrupted.
func Accept4(lfd int) (int, netip.AddrPort, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
		unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, fail("accept4", e)
	}
	return int(r), addrPort(&rsa), nil
}

// LocalAddr is the address socket fd is bound to (getsockname). Returns:
// the address, or the *os.SyscallError of getsockname.
func LocalAddr(fd int) (netip.AddrPort, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	if _, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n))); e != 0 {
		return netip.AddrPort{}, fail("getsockname", e)
	}
	return addrPort(&rsa), nil
}

// addrPort is the IPv4 or IPv6 address in rsa. Returns: the address (an
// IPv4-mapped one unmapped), or the zero AddrPort for another family.
func addrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
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

// Poll asks, without waiting (ppoll with a zero timeout), which of events
// (unix.POLLOUT, unix.POLLRDHUP, …) fd has now; an interrupted call is
// made again. Returns: the events fd has (POLLHUP, POLLERR and POLLNVAL
// included whether asked or not), 0 when none or when the poll failed.
func Poll(fd int, events int16) int16 {
	pfd := unix.PollFd{Fd: int32(fd), Events: events}
	var ts unix.Timespec
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0 || n == 0:
			return 0
		}
		return pfd.Revents
	}
}

// Dup duplicates fd (F_DUPFD_CLOEXEC). Returns: the new descriptor, or the
// *os.SyscallError of fcntl.
func Dup(fd int) (int, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("fcntl", err)
	}
	return nfd, nil
}

// Pipe makes a pipe, both ends non-blocking and close-on-exec. Returns:
// its read and write ends, or the *os.SyscallError of pipe2.
func Pipe() (r, w int, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return -1, -1, os.NewSyscallError("pipe2", err)
	}
	return fds[0], fds[1], nil
}

// SetPipeSize asks for pipe fd's buffer to be size bytes (F_SETPIPE_SZ).
// Returns: its size after the call, which is less than size when the
// kernel refused it (above fs.pipe-max-size, or past the user's soft
// limit of pipe pages), or the *os.SyscallError of fcntl when even the
// size could not be read.
func SetPipeSize(fd, size int) (int, error) {
	if n, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, size); err == nil {
		return n, nil
	}
	n, err := unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return 0, os.NewSyscallError("fcntl", err)
	}
	return n, nil
}

// Nofile is the process's RLIMIT_NOFILE. Returns: its soft and hard
// limits, or the *os.SyscallError of getrlimit.
func Nofile() (cur, max uint64, err error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, os.NewSyscallError("getrlimit", err)
	}
	return lim.Cur, lim.Max, nil
}

// EpollCreate makes an epoll instance, close-on-exec and non-blocking (so
// that Go's poller can watch it). Returns: its descriptor, or the
// *os.SyscallError of the call that failed.
func EpollCreate() (int, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		Close(epfd)
		return -1, os.NewSyscallError("fcntl", err)
	}
	return epfd, nil
}

// EpollCtl is epoll_ctl (op unix.EPOLL_CTL_ADD, _MOD or _DEL) of fd in
// epfd. Returns: nil; unix.EEXIST when op is ADD and fd is already there;
// else the *os.SyscallError of epoll_ctl.
func EpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return fail("epoll_ctl", e)
	}
	return nil
}

// EpollWait is epoll_pwait with a zero timeout: it never blocks (the loop
// waits in Go's poller, on epfd itself). Returns: how many of events it
// filled; unix.EINTR when interrupted; an *os.SyscallError (EBADF: epfd is
// being closed).
func EpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, fail("epoll_pwait", e)
	}
	return int(n), nil
}

// EpollWaitFor is epoll_pwait waiting at most msec milliseconds, made raw:
// to the runtime the calling goroutine is running throughout, so it keeps
// its P (listener's busy loops). Returns as EpollWait.
func EpollWaitFor(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, fail("epoll_pwait", e)
	}
	return int(n), nil
}

// EpollWaitBlocking is epoll_pwait with no timeout, as a system call the
// runtime knows may block: it takes the caller's P away while it does.
// Returns as EpollWait.
func EpollWaitBlocking(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), ^uintptr(0), 0, 0)
	if e != 0 {
		return 0, fail("epoll_pwait", e)
	}
	return int(n), nil
}

// Eventfd makes an eventfd, close-on-exec and non-blocking. Returns: its
// descriptor, or the *os.SyscallError of eventfd2.
func Eventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, os.NewSyscallError("eventfd2", err)
	}
	return fd, nil
}

// Signal adds one to the eventfd fd, which makes it readable.
func Signal(fd int) {
	one := uint64(1)
	unix.Write(fd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// LocalError reports whether a call (a connection's dial, a check's)
// failed for want of one of the process's own resources, which says
// nothing about the peer: descriptors (EMFILE, ENFILE), kernel memory
// (ENOBUFS, ENOMEM), local ports (EADDRNOTAVAIL), or a socket that could
// not be made at all. Returns: true when one of those errnos is in err's
// chain, or err is an *os.SyscallError of socket (as Socket's and Go's
// net package's are).
func LocalError(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range [...]unix.Errno{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.EADDRNOTAVAIL} {
		if errors.Is(err, e) {
			return true
		}
	}
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == "socket"
}
