package listener

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
	"fulcrum/internal/testkit"
)

// fullQueue listens on 127.0.0.1 with a backlog of 0 and fills its accept
// queue, so that the next SYN is dropped (the client retransmits it a
// second later). It returns the listening descriptor, blocking, and its
// address.
func fullQueue(t *testing.T) (int, string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	for range 8 { // connect until a SYN goes unanswered
		c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(c) })
		err = unix.Connect(c, sa)
		if err == nil {
			continue
		}
		if err != unix.EINPROGRESS {
			t.Fatal(err)
		}
		if !pollFor(c, unix.POLLOUT, 300*time.Millisecond) {
			unix.Close(c) // no more retransmissions of its SYN
			return fd, addr
		}
	}
	t.Fatal("accept queue never filled")
	return -1, ""
}

// pollFor waits at most d for fd to have one of events (or an error or
// hang-up), through the interruptions (EINTR) a signal to the thread
// makes: a Poll that returns early for one is no timeout.
func pollFor(fd int, events int16, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		n, err := unix.Poll(pfd, int(left.Milliseconds()))
		if err == unix.EINTR && left > 0 {
			continue
		}
		return n == 1
	}
}

// acceptWithin accepts from the blocking listening socket fd, waiting at
// most d.
func acceptWithin(t *testing.T, fd int, d time.Duration) int {
	t.Helper()
	if !pollFor(fd, unix.POLLIN, d) {
		t.Fatalf("nothing to accept within %v", d)
	}
	nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(nfd) })
	return nfd
}

// dialWaiting reports whether a socket of s waits in one of its loops
// (await): a connect in progress, as the tests below arrange.
func dialWaiting(s *Server) bool {
	if lps := s.lps.Load(); lps != nil {
		for _, lp := range *lps {
			for i := range lp.wait {
				if lp.wait[i].Load() != nil {
					return true
				}
			}
		}
	}
	return false
}

// awaitDialWaiting polls until dialWaiting(s), and says whether it did
// within d.
func awaitDialWaiting(s *Server, d time.Duration) bool {
	return testkit.Until(d, func() error {
		if !dialWaiting(s) {
			return errors.New("no dial waits in a loop")
		}
		return nil
	}) == nil
}

// TestDialWaitsInLoop: a connect with no outcome at once (its SYN dropped
// by a backend whose accept queue is full) waits in an event loop, not in a
// thread, and once the backend takes it the session runs as any other.
func TestDialWaitsInLoop(t *testing.T) {
	testkit.CheckLeaks(t)
	lfd, addr := fullQueue(t)
	p := newProxy(t, "rr", []testBackend{{"a", addr, 1}}, func(s tuned) { s.ConnectTimeout = 20 * time.Second })
	c := p.dial(t)
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if !awaitDialWaiting(p.srv, 5*time.Second) {
		t.Fatal("no connect waiting in a loop within 5s")
	}
	unix.Close(acceptWithin(t, lfd, 5*time.Second)) // the filler: now the retransmitted SYN gets in
	b := acceptWithin(t, lfd, 15*time.Second)
	buf := make([]byte, 5)
	if !pollFor(b, unix.POLLIN, 5*time.Second) {
		t.Fatal("the client's bytes did not reach the backend within 5s")
	}
	if n, err := unix.Read(b, buf); err != nil || string(buf[:n]) != "ping\n" {
		t.Fatalf("backend read %q, %v; want ping", buf[:n], err)
	}
	if _, err := unix.Write(b, []byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(testkit.User(c)).ReadString('\n'); err != nil || line != "pong\n" {
		t.Fatalf("client read %q, %v; want pong", line, err)
	}
	if dialWaiting(p.srv) {
		t.Error("a dial is still registered as waiting")
	}
}

// TestPendingDialDetachesAccept: a connection is served in its accept
// loop's goroutine until it must wait; a connect with no outcome at once
// detaches from the loop first, so the next client is served while it waits.
func TestPendingDialDetachesAccept(t *testing.T) {
	testkit.CheckLeaks(t)
	lfd, addr := fullQueue(t)
	be := testkit.NewServer(t, testkit.Greeter("b"))
	p := newProxy(t, "rr", []testBackend{{"a", addr, 1}, {"b", be.Addr, 1}}, func(s tuned) { s.ConnectTimeout = 30 * time.Second })
	// Round robin from a fresh picker: the first client goes to a, whose
	// connect waits (its SYN dropped, retried after a second); the next to b.
	if _, err := p.dial(t).Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if !awaitDialWaiting(p.srv, 10*time.Second) {
		t.Fatal("no connect waiting in a loop within 10s")
	}
	// The next client goes to b: the accept loop serves it while a's
	// connect waits, which it would otherwise do for 30 s.
	c := p.dial(t)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(testkit.User(c)).ReadString('\n'); err != nil || line != "b\n" {
		t.Fatalf("read %q, %v; want b's greeting while a connect waits", line, err)
	}
	if !dialWaiting(p.srv) {
		t.Fatal("the connect to a ended before b's greeting came: the test proves nothing")
	}
	// Let a take its connection, so that nothing waits when the test ends.
	unix.Close(acceptWithin(t, lfd, 5*time.Second)) // the filler
	acceptWithin(t, lfd, 15*time.Second)
}

// TestWaitingClientDoesNotHoldAccept: a connection that waits before its
// dial (for its PROXY header, for a slot in the service's queue) leaves its
// accept loop first, which goes on accepting.
func TestWaitingClientDoesNotHoldAccept(t *testing.T) {
	cases := []struct {
		name string
		tune func(tuned)
	}{
		{"PROXY header", func(s tuned) {
			s.AcceptProxy, s.ProxyTimeout = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, 30*time.Second
		}},
		{"service queue", func(s tuned) { s.MaxConns, s.QueueTimeout = 1, 30*time.Second }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testkit.CheckLeaks(t)
			be := testkit.NewServer(t, testkit.Greeter("a"))
			p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, tc.tune)
			accepts := func() uint64 { return p.srv.Sockets()[0].Accepts }
			// Three clients that send nothing: with a queue, the first takes
			// the one slot and the others wait for it; without, each waits
			// for its header. The loop must accept all three.
			for range 3 {
				p.dial(t)
			}
			testkit.WaitFor(t, 10*time.Second, func() error {
				if n := accepts(); n < 3 {
					return fmt.Errorf("%d of 3 clients accepted: a waiting client holds the accept loop", n)
				}
				return nil
			})
			p.srv.Close() // the clients' ends close their sessions
		})
	}
}

// TestNoDelayInherited: a listening socket as Prepare makes it has
// TCP_NODELAY, and a socket accepted raw from it, as the accept loop does,
// has it too without a setsockopt of its own.
func TestNoDelayInherited(t *testing.T) {
	testkit.CheckLeaks(t)
	s := New(zerolog.Nop())
	defer s.Wait() // stops the event loops, which Prepare started to watch the socket
	ch, err := s.Prepare([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.abort() // closes what Prepare bound; nothing was committed
	ln := ch.opened[0].ln
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var lv, av int
	var aerr error
	func() {
		fd := ln.fd // nothing accepts from it: not committed
		lv, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
		if !pollFor(fd, unix.POLLIN, 5*time.Second) {
			aerr = errors.New("nothing to accept within 5s")
			return
		}
		nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err != nil {
			aerr = err
			return
		}
		defer unix.Close(nfd)
		av, aerr = unix.GetsockoptInt(nfd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	}()
	if aerr != nil {
		t.Fatal(aerr)
	}
	if lv == 0 || av == 0 {
		t.Errorf("TCP_NODELAY: listening socket %d, accepted socket %d; want both set", lv, av)
	}
}

// TestStaleEventDoesNotCompleteConnect (C3): an event for an earlier use
// of a descriptor's number wakes a connect still in progress on it (as a
// stale entry of a batch does, once its number is reused by the next
// socket). The dial looks again and goes on waiting: it returns no socket
// that is not connected, and connect_timeout still applies.
func TestStaleEventDoesNotCompleteConnect(t *testing.T) {
	testkit.CheckLeaks(t)
	_, addr := fullQueue(t)
	p := newProxy(t, "rr", []testBackend{{"a", addr, 1}}, nil)
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	const timeout = 2 * time.Second
	start := time.Now()
	go func() { // exits when the dial returns: by connect_timeout at the latest
		fd, err := p.srv.dial(&Policy{ConnectTimeout: timeout}, netip.MustParseAddrPort(addr), netip.Addr{}, nil)
		done <- result{fd, err}
	}()
	stale := 0
	for range 3 { // each a wake-up a stale event would give
		if !awaitDialWaiting(p.srv, 5*time.Second) {
			break // the dial returned
		}
		for _, lp := range *p.srv.lps.Load() {
			for fd := range lp.wait {
				if lp.wait[fd].Load() != nil {
					lp.dispatch(unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(fd)}, &loopRun{})
					stale++
				}
			}
		}
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("the dial did not return within its connect timeout and 10 s")
	}
	if r.err == nil {
		sockfd.Close(r.fd)
		t.Fatalf("a connect in progress came back as connected after %v and %d stale events", time.Since(start), stale)
	}
	if !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Errorf("dial: %v; want the connect timeout", r.err)
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("dial returned after %v; want connect_timeout (%v)", d, timeout)
	}
	if stale == 0 {
		t.Error("no stale event was delivered: the test proves nothing")
	}
}

// TestStaleHupForgotten (S6): an event with RDHUP for an earlier use of a
// client socket's number lands on the new session's direction, which
// then distrusts its short reads; once a read has found the socket empty,
// the direction trusts them again, and a real FIN later is still passed on.
func TestStaleHupForgotten(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	ping := func() {
		t.Helper()
		got := make([]byte, 4)
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
			t.Fatalf("echo %q, %v", got, err)
		}
	}
	ping()
	lp := (*p.srv.lps.Load())[0]
	var ss *session
	for i := range lp.tab {
		if ss = lp.tab[i].Load(); ss != nil {
			break
		}
	}
	if ss == nil {
		t.Fatal("no session in the loop")
	}
	parked := func() error {
		if ss.up.state.Load() != stParked {
			return errors.New("the upload direction did not park")
		}
		return nil
	}
	testkit.WaitFor(t, 10*time.Second, parked)
	lp.dispatch(unix.EpollEvent{Events: unix.EPOLLRDHUP, Fd: int32(ss.clientFD)}, &loopRun{}) // stale
	ping()
	testkit.WaitFor(t, 10*time.Second, parked)
	if ss.up.hup.Load() != ss.up.hupSeen { // parked: the state's CAS orders hupSeen's write before this read
		t.Errorf("after the stale event and a read that found the socket empty: %d events, %d seen; want them equal", ss.up.hup.Load(), ss.up.hupSeen)
	}
	c.CloseWrite() // a real FIN, still passed on: the echo backend closes
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Errorf("after the FIN: read %q, %v; want EOF", b, err)
	}
	p.settle(t, 0)
}
