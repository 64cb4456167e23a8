package torture

import (
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// stall is a reader that stops reading for d once at bytes have come.
type stall struct {
	at int64
	d  time.Duration
}

// cpu bounds how many of the harness's goroutines make or check bytes at
// once. Thousands of them would otherwise be runnable together, and in one
// process the Go scheduler would make fulcrum's event loops and timers
// wait seconds behind them for a P: idle timeouts and PROXY or ClientHello
// deadlines would fire for the harness's greed, not for fulcrum's faults.
// The timed service's readers and writers take none: waiting seconds for
// one, they made its idle and half-close timers fire for the harness's
// lateness (a writer that had the id at 310ms wrote at 4.4s), and they
// are few.
var cpu = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2))

// busy takes a token for work on n bytes; a few bytes (slow readers, tiny
// writes) cost less than waiting for one.
func busy(n int) func() {
	if n < 4<<10 {
		return func() {}
	}
	cpu <- struct{}{}
	return func() { <-cpu }
}

var (
	errOwnReset = errors.New("reset by the harness, as planned")
	errCorrupt  = errors.New("wrong bytes")
)

// readStream reads the stream into v until EOF, an error, the planned
// reset (after rstAt bytes; -1 never) or the first wrong byte. slow reads
// a few bytes at a time with pauses; st stalls once. It reports whether
// the stream ended with a FIN. A timed reader (the timed service's) takes
// no busy token: a reader late for one lets its socket fill, and the
// half-close timer fires for the harness's slowness.
func readStream(r io.Reader, v *verifier, slow bool, st stall, rstAt int64, rst *resetOnce, rng *rand.Rand, timed bool) (eof bool, err error) {
	buf := make([]byte, 32<<10)
	for reads := 0; ; reads++ {
		if st.d > 0 && v.n >= st.at {
			time.Sleep(st.d)
			st.d = 0
		}
		if rstAt >= 0 && v.n >= rstAt {
			rst.reset()
			return false, errOwnReset
		}
		k := len(buf)
		if slow {
			k = 1 + rng.IntN(256)
			if reads%8 == 7 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if rstAt >= 0 {
			k = int(min(int64(k), rstAt-v.n))
		}
		n, err := r.Read(buf[:k])
		done := func() {}
		if !timed {
			done = busy(n)
		}
		v.write(buf[:n])
		done()
		if v.bad != nil {
			rst.reset() // the other end must not wait for a reader that left
			return false, errCorrupt
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return true, nil
		case isTimeout(err):
			return false, errStalled
		default:
			return false, err
		}
	}
}

// writeStream writes the stream's n bytes in writes of random sizes (tiny:
// at most 64), sending one urgent byte (MSG_OOB, not part of the stream)
// when oob bytes have gone (-1 never), and resetting the connection when
// rstAt have (-1 never). A write that makes no progress for limit has
// stalled.
// marks, if not nil, gets the stream offset and time after every write
// that moved bytes, and after the write that failed (its whole chunk):
// when each byte was in the socket at the latest, or would have been.
// Such a writer (the timed service's) takes no busy token: under load it
// waited seconds for one, and the timers it is judged by fired meanwhile.
func writeStream(c *net.TCPConn, id uint64, dir byte, n, oob, rstAt int64, tiny bool, rst *resetOnce, rng *rand.Rand, limit time.Duration, prog *progress, marks *[]wmark) (sent int64, crc uint32, err error) {
	buf := make([]byte, 64<<10)
	for {
		if oob >= 0 && sent >= oob {
			if err := sendOOB(c, oobByte(id, dir, sent), limit); err != nil {
				return sent, crc, err
			}
			oob = -1
		}
		if rstAt >= 0 && sent >= rstAt {
			rst.reset()
			return sent, crc, errOwnReset
		}
		if sent >= n {
			return sent, crc, nil
		}
		k := int64(1 + rng.IntN(len(buf)))
		if tiny {
			k = int64(1 + rng.IntN(64))
		}
		k = min(k, n-sent)
		if oob >= 0 {
			k = min(k, oob-sent)
		}
		if rstAt >= 0 {
			k = min(k, rstAt-sent)
		}
		done := func() {}
		if marks == nil { // a timed writer is judged on when it writes: it waits for no token
			done = busy(int(k))
		}
		fill(id, dir, sent, buf[:k])
		crc = crc32.Update(crc, castagnoli, buf[:k])
		done()
		for off := int64(0); off < k; {
			c.SetWriteDeadline(time.Now().Add(limit))
			w, err := c.Write(buf[off:k])
			sent, off = sent+int64(w), off+int64(w)
			if w > 0 {
				prog.moved()
				if marks != nil {
					*marks = append(*marks, wmark{to: sent, at: time.Now()})
				}
			}
			if err != nil {
				if isTimeout(err) && !prog.stalled(limit) {
					continue // the other direction moves: a peer may read only after it is done
				}
				if marks != nil { // the rest of the chunk never went in: it would have by now
					*marks = append(*marks, wmark{to: sent + k - off, at: time.Now()})
				}
				if off < k { // part of the chunk was made and not sent: count what was
					done := busy(int(sent))
					crc = crcOf(id, dir, sent)
					done()
				}
				return sent, crc, stallOr(err)
			}
		}
	}
}

// wmark is a write's end: the stream had reached offset to at time at.
type wmark struct {
	to int64
	at time.Time
}

// writtenBy is when the byte at offset off was in the socket at the
// latest, or its write failed (zero if no write came to it).
func writtenBy(marks []wmark, off int64) time.Time {
	for _, m := range marks {
		if m.to > off {
			return m.at
		}
	}
	return time.Time{}
}

// sendOOB sends one byte of TCP urgent data.
func sendOOB(c *net.TCPConn, b byte, limit time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(limit))
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), []byte{b}, unix.MSG_OOB, nil)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

func stallOr(err error) error {
	if isTimeout(err) {
		return errStalled
	}
	return err
}
