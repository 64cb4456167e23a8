package listener

// One direction of a session: its descriptors, its copy state and its
// place in the event loop's state machine (loop.go, whose rules govern
// every field touched from more than one goroutine).

import (
	"sync/atomic"
	"time"
)

// epoch anchors mono, so that mono reads only the monotonic clock.
var epoch = time.Now()

// mono is nanoseconds on the monotonic clock since the process started.
func mono() int64 { return int64(time.Since(epoch)) }

// half is one direction of a session, run by its event loop (loop.go).
type half struct {
	ss  *session
	id  int32 // 1 up (client → backend), 2 down
	x   xfer
	n   int64 // bytes written to dst; the half's own, read by the session after both end
	err error // what ended the half, nil for a clean EOF; set before the half ends

	sfd, dfd int           // the descriptors it reads and writes
	state    atomic.Int32  // stParked, stRunning, stKicked or stDone
	hup      atomic.Uint32 // events for src that carried RDHUP, HUP, ERR or PRI, counted
	hupSeen  uint32        // hup as it was before the last read that found src empty
	wantOut  atomic.Bool   // waiting for dst to take more: EPOLLOUT concerns this half
	drained  bool          // the last fill was a short read: src was empty then
	outArmed bool          // dst's registration has EPOLLOUT (only this half writes dst)
}

// count books n bytes written: the half's total, the backend's live
// counter and, with an idle timeout, the session's last activity.
func (h *half) count(n int) {
	if n <= 0 {
		return
	}
	h.n += int64(n)
	ss := h.ss
	if h.id == 1 {
		ss.t.B.AddBytes(int64(n), 0)
	} else {
		ss.t.B.AddBytes(0, int64(n))
	}
	if ss.idle > 0 || ss.first.Load() != 0 {
		ss.last.Store(mono())
	}
}
