package listener

// fulcrum's copy path: each direction of a session moves bytes with its own
// non-blocking syscalls on the two sockets' descriptors, run by an event
// loop (loop.go), so that nothing but the two sockets is held while a
// connection is idle. The syscalls are raw: they never block, and the
// runtime's bookkeeping around a syscall would cost more than most of them.
//
// A direction starts in buffer mode: read(2) into a pooled 16 KiB buffer,
// then send(2) with MSG_NOSIGNAL. A read that fills the buffer switches it
// to splice mode: splice(2) socket → pipe, then pipe → socket, through a
// pipe lent by the Server's pipePool for as long as bytes are moving. A
// splice that brings in less than spliceMin switches it back (HAProxy's
// splice-auto). Bulk transfers then cost no copy through user space, and
// small messages no pipe.
//
// Every byte written is counted as it goes: into the direction's total,
// into the backend's live counters, and, with an idle timeout, as activity.

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

const (
	bufSize   = 16 << 10 // a direction's buffer (HAProxy's default tune.bufsize)
	spliceMin = 4 << 10  // a splice that brings in less goes back to the buffer
	pipeSize  = 1 << 20  // 1 MiB: single-stream throughput is ~25% lower with the 64 KiB default
	pipesKept = 64       // empty pipes a Server keeps for reuse
)

// copyMode says how a direction moves bytes.
type copyMode uint8

func (m copyMode) String() string {
	switch m {
	case copyBuffer:
		return "buffer"
	case copySplice:
		return "splice"
	}
	return "auto"
}

var bufs = sync.Pool{New: func() any { return new([bufSize]byte) }}

// xfer is one direction's copy state, whatever waits for its sockets. Its
// owner alternates fill and flush: fill only when nothing is pending, flush
// until nothing is. Between a fill and the end of its flush it holds a
// buffer or a pipe; otherwise it holds neither.
type xfer struct {
	pipes    *pipePool
	mode     copyMode
	splice   bool           // the next fill splices
	p        *pipe          // held from a fill that spliced until drained
	buf      *[bufSize]byte // held from a fill that read until sent
	off, end int            // buf[off:end] is still to be sent
}

func newXfer(pipes *pipePool, mode copyMode) xfer {
	return xfer{pipes: pipes, mode: mode, splice: mode == copySplice}
}

// fill reads what src has. It returns the bytes read, (0, nil) at EOF, and
// unix.EAGAIN when src has nothing to read; x then holds no buffer or pipe.
// marked says an event for src carried RDHUP, HUP, ERR or PRI since src
// was last found empty (half.hup).
//
// In splice mode the pipe is always empty here, so the socket side is the
// only one that can make splice return EAGAIN or 0: EAGAIN is "no data" and
// 0 is EOF, but for urgent data. Every socket has
// SO_OOBINLINE (setNoDelay, setDialOpts), so an urgent byte is an ordinary
// byte of the stream, which read(2) steps over; but splice (tcp_read_sock)
// never passes the urgent mark: there it finds nothing, EAGAIN, or 0 once
// the peer's FIN is in, with bytes still queued behind the mark. So a
// splice's 0 is looked at again with a read (one syscall per direction's
// end), and so is its EAGAIN once an event said urgent data (PRI sets
// marked, and only the state of the socket can clear the mark).
//
// A splice asks for at most most bytes (no more than pipeSize).
func (x *xfer) fill(src int, marked bool, most int) (int, error) {
	if x.splice {
		if x.p == nil {
			x.p = x.pipes.get()
		}
		if x.p != nil {
			n, err := sockfd.Splice(src, x.p.w, most)
			if err == nil && n > 0 {
				x.p.n = n
				if n < spliceMin && x.mode == copyAuto {
					x.splice = false // small reads: back to the buffer once this is out
				}
				return n, nil
			}
			x.pipes.put(x.p) // empty: the pipe was empty before this splice
			x.p = nil
			if err != nil && (err != unix.EAGAIN || !marked) {
				return 0, err
			}
			// 0, or EAGAIN with urgent data: maybe at a mark; read to see.
		}
		// No pipe to be had (descriptors exhausted), or a read to look past
		// a mark: copy through the buffer.
	}
	if x.buf == nil {
		x.buf = bufs.Get().(*[bufSize]byte)
	}
	for {
		n, err := sockfd.Read(src, x.buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			bufs.Put(x.buf)
			x.buf = nil
			return 0, err
		}
		x.off, x.end = 0, n
		if n == bufSize && x.mode == copyAuto {
			x.splice = true
		}
		return n, nil
	}
}

// flush writes what the last fill brought in to dst. It returns the bytes
// written by this call and unix.EAGAIN if dst is full before all are
// written; then x keeps the rest for the next call.
func (x *xfer) flush(dst int) (int, error) {
	written := 0
	if p := x.p; p != nil {
		for p.n > 0 {
			n, err := sockfd.Splice(p.r, dst, p.n)
			if err != nil {
				return written, err
			}
			if n == 0 { // cannot happen for a socket; never spin on it
				return written, errShortSplice
			}
			p.n -= n
			written += n
		}
		if !x.splice { // back in buffer mode: the pipe is no longer needed
			x.pipes.put(p)
			x.p = nil
		}
		return written, nil
	}
	for x.off < x.end {
		n, err := sockfd.Send(dst, x.buf[x.off:x.end])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return written, err
		}
		x.off += n
		written += n
	}
	if x.buf != nil {
		bufs.Put(x.buf)
		x.buf = nil
	}
	return written, nil
}

// pending reports whether the last fill brought in bytes not yet flushed.
func (x *xfer) pending() bool {
	if x.p != nil {
		return x.p.n > 0
	}
	return x.off < x.end
}

// free gives back what x holds when its direction ends: a pipe that may
// still hold bytes is closed, not pooled.
func (x *xfer) free() {
	if x.p != nil {
		x.pipes.put(x.p)
		x.p = nil
	}
	if x.buf != nil {
		bufs.Put(x.buf)
		x.buf = nil
	}
}

var errShortSplice = errors.New("splice from a non-empty pipe moved nothing")

const (
	copyAuto   copyMode = iota // buffer, switching to splice while reads fill the buffer
	copyBuffer                 // always read/send through the buffer
	copySplice                 // always splice (when a pipe can be had)
)
