package listener

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/sched"
)

// How a connection ended, as the access log says it.
const (
	endClient    = "client close"   // the client sent FIN first; both sides then closed cleanly
	endBackend   = "backend close"  // the backend sent FIN first
	endReset     = "reset"          // an error (RST, write failure) on either side
	endIdle      = "idle timeout"   // no byte either way for idle_timeout
	endConnect   = "connect failed" // no backend could be dialled
	endNoBackend = "no backend"     // nothing eligible to dial
	endDrained   = "drained"        // closed at a drain deadline
)

// handle serves one accepted connection from start to end. It holds one
// count of s.wg, which a successful dial hands on to the session: the
// goroutine that accepted and dialled then exits, and the session's two
// directions run in fresh goroutines (whose stacks have not grown with the
// dial's) until the last of them finishes the session.
func (s *Server) handle(c *net.TCPConn, key netip.AddrPort) {
	start := time.Now()
	svc := s.tbl.Load().Route(key)
	if svc == nil { // the listener is being closed by a reload
		c.Close()
		s.wg.Done()
		return
	}
	var r sched.Request
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		r.Client = a.AddrPort()
	}
	bc, t, tries, err := s.connect(svc, &r)
	if err != nil {
		c.Close()
		end := endConnect
		if errors.Is(err, sched.ErrNoBackend) && tries == 0 {
			end = endNoBackend
		}
		s.access(svc, r.Client, nil, start, 0, 0, end, err)
		s.wg.Done()
		return
	}
	ss := newSession(s, svc, t, c, bc, r.Client, start)
	if !t.B.Track(ss) { // the backend's drain deadline has passed
		ss.drained.Store(true)
		ss.finish()
		return
	}
	if s.parked || svc.Parked {
		if pl := s.poller(); pl != nil && ss.park(pl) {
			return
		}
	}
	ss.run()
}

// connect picks and dials backends until one answers, trying at most
// svc.Retries more after the first failure and never one backend twice.
// tries counts the dials that failed.
func (s *Server) connect(svc *sched.Service, r *sched.Request) (*net.TCPConn, *sched.Target, int, error) {
	var last error = sched.ErrNoBackend
	tries := 0
	for tries <= svc.Retries {
		i, err := svc.Picker.Pick(r)
		if err != nil {
			return nil, nil, tries, last
		}
		if !r.MarkTried(i) {
			return nil, nil, tries, last
		}
		t := &svc.Targets[i]
		if !t.B.Acquire(0) { // draining since the pick: not a failure
			continue
		}
		d := net.Dialer{Timeout: svc.ConnectTimeout, KeepAliveConfig: keepAlive}
		c, err := d.Dial("tcp", t.Addr.String())
		if err == nil {
			return c.(*net.TCPConn), t, tries, nil
		}
		t.B.Release()
		t.B.ConnectFailed()
		tries++
		last = err
		s.log.Warn().Err(err).Str("service", svc.Name).Str("backend", t.B.Name).Msg("connect failed")
	}
	return nil, nil, tries, last
}

// logsAccess reports whether access would write a line for svc now.
func (s *Server) logsAccess(svc *sched.Service) bool {
	level := zerolog.DebugLevel
	if svc.AccessLog {
		level = zerolog.InfoLevel
	}
	return level >= s.log.GetLevel() && level >= zerolog.GlobalLevel()
}

func (s *Server) access(svc *sched.Service, client netip.AddrPort, t *sched.Target, start time.Time, in, out int64, end string, err error) {
	var e *zerolog.Event
	if svc.AccessLog {
		e = s.log.Info()
	} else {
		e = s.log.Debug()
	}
	if e == nil {
		return
	}
	e = e.Str("service", svc.Name).Stringer("client", client)
	if t != nil {
		e = e.Str("backend", t.B.Name)
	}
	e = e.Int64("bytes_in", in).Int64("bytes_out", out).Float64("duration_ms", float64(time.Since(start).Microseconds())/1000).Str("end", end)
	if err != nil && end != endClient && end != endBackend {
		e = e.AnErr("error", err)
	}
	e.Msg("connection")
}

// session is one proxied connection after a successful dial. It owns both
// sockets and the count of Server.wg that handle took for the connection.
// Its two halves run in goroutines of their own; the last one to end closes
// both sockets, releases the backend, logs and calls wg.Done (finish).
type session struct {
	srv     *Server
	svc     *sched.Service
	t       *sched.Target
	client  *net.TCPConn
	backend *net.TCPConn
	addr    netip.AddrPort // the client's
	start   time.Time
	idle    time.Duration // 0 = none

	up   half // client → backend
	down half // backend → client

	// The parked design only (parked.go).
	pl                  *poller     // the epoll both sockets are registered in; nil in the pooled design
	clientFD, backendFD int         // the sockets' descriptors
	timer               *time.Timer // the idle timer
	idleFired           atomic.Bool // the idle timer stopped the session

	live     atomic.Int32 // halves still running
	last     atomic.Int64 // mono() of the last byte written either way (idle timeout only)
	first    atomic.Int32 // which half reached EOF first: 1 up, 2 down
	failed   atomic.Int32 // which half ended with an error first: 1 up, 2 down
	stopping atomic.Bool  // both sockets are being shut down: errors and EOFs from now on are its echo
	drained  atomic.Bool
}

var errIdle = errors.New("idle timeout")

func newSession(s *Server, svc *sched.Service, t *sched.Target, client, backend *net.TCPConn, addr netip.AddrPort, start time.Time) *session {
	ss := &session{srv: s, svc: svc, t: t, client: client, backend: backend, addr: addr, start: start, idle: svc.IdleTimeout}
	ss.up = half{ss: ss, id: 1, src: client, dst: backend, x: newXfer(&s.pipes, s.mode)}
	ss.down = half{ss: ss, id: 2, src: backend, dst: client, x: newXfer(&s.pipes, s.mode)}
	return ss
}

// run starts both halves and returns; the session finishes itself.
func (ss *session) run() {
	ss.live.Store(2)
	if ss.idle > 0 {
		ss.last.Store(mono())
		d := time.Now().Add(ss.idle)
		ss.client.SetDeadline(d)
		ss.backend.SetDeadline(d)
	}
	go ss.up.run()   // exits when the client → backend direction ends
	go ss.down.run() // exits when the backend → client direction ends
}

// Close makes both directions end now; the session then ends as drained.
// It lets a backend's drain deadline close a session it tracks.
func (ss *session) Close() error {
	ss.drained.Store(true)
	ss.stop()
	return nil
}

// stop shuts down both sockets both ways. That wakes a half waiting on
// either (reads then see EOF, writes EPIPE) without closing a descriptor
// that the other half may be using: only finish closes.
func (ss *session) stop() {
	if ss.stopping.Swap(true) {
		return
	}
	shutdown(ss.client)
	shutdown(ss.backend)
}

func shutdown(c *net.TCPConn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) }) // ENOTCONN after a reset: nothing to do
}

// halfDone is called by each half as it ends. A clean EOF is passed on as a
// FIN and the other direction keeps flowing; an error stops both.
func (ss *session) halfDone(h *half, err error) {
	h.x.release()
	h.err = err
	switch {
	case err != nil:
		ss.failed.CompareAndSwap(0, h.id)
		ss.stop()
	case !ss.stopping.Load():
		ss.first.CompareAndSwap(0, h.id)
		h.dst.CloseWrite()
	}
	if ss.live.Add(-1) == 0 {
		if ss.pl != nil && ss.srv.logsAccess(ss.svc) {
			// Not in the poller, which runs parked directions: the access
			// log may block on a slow sink and would stall them all.
			go ss.finish() // exits when the session is logged and released
			return
		}
		ss.finish()
	}
}

// finish closes both sockets, gives the backend its slot back, logs the
// session and ends its count in the Server's WaitGroup.
func (ss *session) finish() {
	if ss.pl != nil {
		ss.pl.forget(ss)
		if ss.timer != nil {
			ss.timer.Stop()
		}
	}
	ss.client.Close()
	ss.backend.Close()
	b := ss.t.B
	b.Untrack(ss)
	b.Release()
	ss.srv.access(ss.svc, ss.addr, ss.t, ss.start, ss.up.n, ss.down.n, ss.end(), ss.firstErr())
	ss.srv.wg.Done()
}

// firstErr is the error that ended the session, or nil.
func (ss *session) firstErr() error {
	if ss.idleFired.Load() {
		return errIdle
	}
	switch ss.failed.Load() {
	case 1:
		return ss.up.err
	case 2:
		return ss.down.err
	}
	return nil
}

// end says how the session ended.
func (ss *session) end() string {
	if ss.drained.Load() {
		return endDrained
	}
	if err := ss.firstErr(); err != nil {
		if errors.Is(err, errIdle) {
			return endIdle
		}
		return endReset
	}
	if ss.first.Load() == 2 {
		return endBackend
	}
	return endClient
}
