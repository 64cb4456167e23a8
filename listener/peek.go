package listener

// The one way fulcrum waits for a client's first bytes, whatever they are
// (a PROXY header, a TLS ClientHello, an SSLRequest, a CancelRequest):
// peeked (MSG_PEEK) on the client's own descriptor, never consumed but by
// the reader that has parsed them, so that the socket handed to the copy
// path still holds the first byte the backend must see.

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// fdPeeker peeks at a client's non-blocking socket: at what has arrived,
// without waiting, and only when that is not enough, waits, until timeout
// after its first wait. A client's first message has mostly arrived by the
// time it is accepted, so most connections never wait, nor read the clock
// for a deadline (0.1 µs here, a third of the parse). A wait for the first
// bytes is done in a loop's epoll, where the session will register the socket anyway; a wait
// for more of a message that has begun (rare: a hello split across
// segments) in Go's poller through a duplicate of the descriptor, whose
// edge-triggered registration sees new bytes behind those already peeked.
type fdPeeker struct {
	fd       int
	loops    loopSource // where to wait for first bytes; nil: Go's poller
	timeout  time.Duration
	deadline time.Time // zero until the first wait
	lp       *loop     // the loop of loops that fd is registered in, once it is
	inLoop   bool      // fd is registered in lp
	f        *os.File  // the duplicate in Go's poller; nil until needed
}

// loopSource lends event loops; a *Server is one.
type loopSource interface {
	loop() (*loop, error)
}

// peek fills buf with what fd holds, once that is more than seen bytes,
// waiting for it until the deadline: io.EOF if the client closes first.
func (p *fdPeeker) peek(buf []byte, seen int) (int, error) {
	for {
		n, err := sockfd.RecvPeek(p.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil && (n > seen || n == len(buf)):
			return n, nil
		case err != nil && err != unix.EAGAIN:
			return 0, err
		case err == nil || p.loops == nil: // seen bytes and no more yet, or no loop
			return p.peekPoller(buf, seen)
		}
		if p.lp == nil {
			if p.lp, err = p.loops.loop(); err != nil {
				p.loops = nil // wait the other way
				continue
			}
		}
		switch err := p.lp.await(p.fd, unix.EPOLLIN|unix.EPOLLRDHUP, p.until(), &p.inLoop); {
		case deadlineHit(err):
			return 0, err
		case err != nil: // the epoll refused it (out of memory or watches): wait the other way
			p.loops = nil
		}
	}
}

// peekPoller is peek waiting in Go's poller, on a duplicate of the socket.
func (p *fdPeeker) peekPoller(buf []byte, seen int) (int, error) {
	if p.f == nil {
		var err error
		if p.f, err = pollable(p.fd); err != nil {
			return 0, err
		}
		p.f.SetReadDeadline(p.until())
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	return peekRaw(rc, buf, func(b []byte) bool { return len(b) > seen })
}

// peekRaw peeks at a socket in Go's poller (rc) into buf, until its read
// deadline, for bytes that decide(b) accepts: decide returns done when b is
// enough to stop. It consumes nothing. Returns: the bytes peeked, with
// io.EOF when the peer has finished sending before decide was satisfied.
func peekRaw(rc syscall.RawConn, buf []byte, decide func(b []byte) (done bool)) (int, error) {
	var n int
	var perr error
	err := rc.Read(func(fd uintptr) bool {
		k, e := sockfd.RecvPeek(int(fd), buf)
		switch {
		case e == unix.EAGAIN || e == unix.EINTR:
			return false // nothing yet: wait for readability
		case e != nil:
			perr = e
			return true
		case k == 0:
			perr = io.EOF
			return true
		}
		n = k
		if decide(buf[:k]) || k == len(buf) {
			return true
		}
		// Part of what is needed. A peek still sees the pending bytes after
		// the peer's FIN, so ask whether it has finished sending.
		if sockfd.Poll(int(fd), unix.POLLRDHUP)&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			perr = io.EOF
			return true
		}
		return false // wait for more (a new edge)
	})
	if err == nil {
		err = perr
	}
	return n, err
}

// until returns the deadline of every wait, set by the first.
func (p *fdPeeker) until() time.Time {
	if p.deadline.IsZero() {
		p.deadline = time.Now().Add(p.timeout)
	}
	return p.deadline
}

// close closes the duplicate, if any; the socket stays open.
func (p *fdPeeker) close() {
	if p.f != nil {
		p.f.Close()
	}
}

// pollable returns a duplicate of the non-blocking socket fd as a file in
// Go's poller, whose deadlines work: the cheapest way to wait for it (a
// net.Conn would cost a second duplicate and address lookups). The caller
// closes it; fd stays open.
func pollable(fd int) (*os.File, error) {
	nfd, err := sockfd.Dup(fd)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), "socket"), nil // non-blocking, so in the poller
}

func deadlineHit(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
