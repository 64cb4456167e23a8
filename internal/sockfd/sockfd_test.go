//go:build linux

package sockfd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// pair returns the two ends of a loopback TCP connection as raw
// non-blocking descriptors, closed when the test ends.
func pair(t *testing.T) (client, server int) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lnf, err := ln.File() // a blocking duplicate: accept4 waits for the connect below
	if err != nil {
		t.Fatal(err)
	}
	defer lnf.Close()
	c, err := Socket(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(c) })
	if err := Connect(c, ln.Addr().(*net.TCPAddr).AddrPort()); err != nil && err != unix.EINPROGRESS {
		t.Fatalf("Connect = %v", err)
	}
	s, peer, err := Accept4(int(lnf.Fd()))
	if err != nil {
		t.Fatalf("Accept4 = %v", err)
	}
	t.Cleanup(func() { Close(s) })
	if local, err := LocalAddr(c); err != nil || local != peer {
		t.Errorf("LocalAddr = %v, %v; Accept4 says the peer is %v", local, err, peer)
	}
	if Poll(c, unix.POLLOUT)&unix.POLLOUT == 0 || ConnectError(c) != nil {
		t.Fatalf("the connect did not complete: %v", ConnectError(c))
	}
	return c, s
}

// TestErrors: what callers compare comes back bare and costs no
// allocation; every other failure is an *os.SyscallError naming the call,
// with the errno inside.
func TestErrors(t *testing.T) {
	c, s := pair(t)
	buf := make([]byte, 16)
	if _, err := Read(s, buf); err != unix.EAGAIN {
		t.Fatalf("Read of an empty socket = %v; want the bare EAGAIN", err)
	}
	if n := testing.AllocsPerRun(100, func() { Read(s, buf) }); n != 0 {
		t.Errorf("Read to EAGAIN allocates %v times; want 0", n)
	}
	if _, err := RecvPeek(s, buf); err != unix.EAGAIN {
		t.Fatalf("RecvPeek of an empty socket = %v; want the bare EAGAIN", err)
	}
	if n, err := Send(c, []byte("ping")); n != 4 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if Poll(s, unix.POLLIN) == 0 {
		t.Fatal("Poll sees nothing to read after a Send")
	}
	if n, err := RecvPeek(s, buf); n != 4 || err != nil {
		t.Fatalf("RecvPeek = %d, %v; want 4", n, err)
	}
	if n, err := Read(s, buf); n != 4 || err != nil || string(buf[:4]) != "ping" {
		t.Fatalf("Read = %d %q, %v; want ping", n, buf[:n], err)
	}
	_, err := Read(-1, buf)
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "read" || !errors.Is(err, unix.EBADF) {
		t.Errorf("Read(-1) = %#v; want an *os.SyscallError of read wrapping EBADF", err)
	}
	if !errors.Is(EpollCtl(-1, unix.EPOLL_CTL_ADD, s, &unix.EpollEvent{}), unix.EBADF) {
		t.Error("EpollCtl on a bad epoll descriptor did not say EBADF")
	}
}

// TestLocalError: the failures that say nothing about the peer.
func TestLocalError(t *testing.T) {
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, c := range []struct {
		err   error
		local bool
	}{
		{dial(os.NewSyscallError("socket", unix.EMFILE)), true},
		{dial(os.NewSyscallError("connect", unix.EADDRNOTAVAIL)), true},
		{dial(os.NewSyscallError("socket", unix.EAFNOSUPPORT)), true},
		{fmt.Errorf("wrapped: %w", unix.ENOBUFS), true},
		{dial(os.NewSyscallError("connect", unix.ENFILE)), true},
		{dial(os.NewSyscallError("connect", unix.ECONNREFUSED)), false},
		{dial(os.NewSyscallError("connect", unix.EHOSTUNREACH)), false},
		{dial(os.ErrDeadlineExceeded), false},
		{nil, false},
	} {
		if got := LocalError(c.err); got != c.local {
			t.Errorf("LocalError(%v) = %v; want %v", c.err, got, c.local)
		}
	}
}

// TestPipe: a pipe, resized, moves bytes by splice both ways.
func TestPipe(t *testing.T) {
	c, s := pair(t)
	r, w, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer Close(r)
	defer Close(w)
	if n, err := SetPipeSize(r, 1<<16); err != nil || n < 1<<16 {
		t.Errorf("SetPipeSize = %d, %v; want at least 64 KiB", n, err)
	}
	if _, err := Splice(s, w, 1<<16); err != unix.EAGAIN {
		t.Fatalf("Splice from an empty socket = %v; want the bare EAGAIN", err)
	}
	Send(c, []byte("through")) // on loopback, in s's queue when Send returns
	if n, err := Splice(s, w, 1<<16); n != 7 || err != nil {
		t.Fatalf("Splice in = %d, %v; want 7", n, err)
	}
	if n, err := Splice(r, s, 7); n != 7 || err != nil {
		t.Fatalf("Splice out = %d, %v; want 7", n, err)
	}
}
