package listener

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/backend"
	"fulcrum/sched"
)

// How a connection ended, as the access log says it.
const (
	endClient    = "client close"   // the client sent FIN first; both sides then closed cleanly
	endBackend   = "backend close"  // the backend sent FIN first
	endReset     = "reset"          // an error (RST, write failure) on either side
	endIdle      = "idle timeout"   // no byte either way for idle_timeout
	endConnect   = "connect failed" // no backend could be dialled
	endNoBackend = "no backend"     // nothing eligible to dial: every backend down, draining or at weight 0
	endFull      = "full"           // every eligible backend, or the service, at max_conns (past queue_timeout)
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
		r.Client = unmap(a.AddrPort())
	}
	orig := netip.AddrPort{} // the address the client asked for
	if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
		orig = unmap(a.AddrPort())
	}
	// Rejections are counted before the close, so a client that sees the
	// close also sees the count.
	reject := func(kind int, err error) {
		svc.Group.Reject(kind, func(total uint64) {
			s.log.Warn().Str("service", svc.Name).Stringer("client", r.Client).Err(err).
				Str("reason", backend.RejectNames[kind]).Uint64("rejected_so_far", total).Msg("connection rejected")
		})
		c.Close()
		s.wg.Done()
	}
	if kind, err := s.screen(svc, c, &r.Client, &orig); err != nil {
		reject(kind, err)
		return
	}
	if !svc.Group.AcquireSource(r.Client.Addr(), svc.MaxConnsPerSource) {
		reject(backend.RejectPerSource, fmt.Errorf("%d connections from %s already", svc.MaxConnsPerSource, r.Client.Addr()))
		return
	}
	// From here a source slot is held, and from admit on a service slot:
	// an early end gives them back here, a session gives them back in finish.
	fail := func(t *sched.Target, end string, err error) {
		svc.Group.ReleaseSource(r.Client.Addr(), svc.MaxConnsPerSource)
		c.Close()
		s.access(svc, r.Client, t, start, 0, 0, end, err)
		s.wg.Done()
	}
	if !admit(svc, start) {
		svc.Group.Refused()
		fail(nil, endFull, errFull)
		return
	}
	bc, t, tries, err := s.connect(svc, &r, start)
	if err != nil {
		end := endConnect
		switch {
		case errors.Is(err, errFull):
			end = endFull
			svc.Group.Refused()
		case errors.Is(err, sched.ErrNoBackend) && tries == 0:
			end = endNoBackend
		}
		svc.Group.Release()
		fail(nil, end, err)
		return
	}
	if t.ProxyProtocol > 0 {
		if err := writeHeader(bc, t.ProxyProtocol, r.Client, orig); err != nil {
			bc.Close()
			t.B.Release()
			svc.Group.Release()
			fail(t, endReset, fmt.Errorf("send PROXY header: %w", err))
			return
		}
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

// screen applies what is decided before any backend is dialled: the PROXY
// header (read from a trusted balancer, which may change client and orig;
// refused from anyone else), the access lists and the accept rate. It
// returns the backend.Reject kind and why when the connection must go.
func (s *Server) screen(svc *sched.Service, c *net.TCPConn, client, orig *netip.AddrPort) (int, error) {
	if len(svc.AcceptProxy) > 0 {
		if svc.TrustsProxy(client.Addr()) {
			h, err := readHeader(c, svc.ProxyTimeout)
			if err != nil {
				return backend.RejectProxy, err
			}
			if src, dst, ok := addrs(h); ok {
				*client, *orig = src, dst
			}
		} else if bad, err := spoofed(c, svc.ProxyTimeout); bad || err != nil {
			if err == nil {
				err = errSpoofed
			}
			return backend.RejectProxy, err
		}
	}
	if !svc.Allowed(client.Addr()) {
		return backend.RejectDenied, errors.New("denied by allow/deny")
	}
	if !svc.Group.AllowAccept() {
		return backend.RejectRate, errors.New("over accept_rate")
	}
	return 0, nil
}

// connect picks and dials backends until one answers, trying at most
// svc.Retries more after the first failure and never one backend twice. It
// picks from the primaries, or from the backups while no primary is up. When
// every eligible backend is full it waits up to svc.QueueTimeout for a slot
// (errFull after that, or at once without a queue). tries counts the dials
// that failed.
func (s *Server) connect(svc *sched.Service, r *sched.Request, start time.Time) (*net.TCPConn, *sched.Target, int, error) {
	var last error = sched.ErrNoBackend
	tries := 0
	targets, picker := svc.Pool()
	spins := 0
	var w *backend.Waiter
	defer func() {
		if w != nil {
			w.Leave()
		}
	}()
	for tries <= svc.Retries {
		var wake <-chan struct{}
		if w != nil {
			wake = svc.Group.Wake() // before the pick: a slot freed after it wakes us
		}
		i, err := picker.Pick(r)
		if err != nil {
			if tries > 0 || !up(targets, r) {
				return nil, nil, tries, last // nothing is up: close at once
			}
			if spins < 3 && !full(targets, r) {
				spins++ // a slot freed between the pick and now: pick again
				continue
			}
			if svc.QueueTimeout <= 0 {
				return nil, nil, tries, errFull
			}
			if w == nil {
				w = svc.Group.Enqueue()
				continue // try once more, now that a freed slot will wake us
			}
			if !w.Wait(wake, start.Add(svc.QueueTimeout)) {
				return nil, nil, tries, errFull
			}
			continue
		}
		t := &targets[i]
		if !t.B.Acquire(t.MaxConns) {
			// Full or draining since the pick: not a failure, and not tried
			// (the next pick skips it while it is full, takes it once free).
			if spins++; spins > 64 {
				return nil, nil, tries, errFull
			}
			continue
		}
		if !r.MarkTried(i) {
			t.B.Release()
			return nil, nil, tries, last
		}
		if tries > 0 {
			svc.Group.Retried()
		}
		d := net.Dialer{Timeout: svc.ConnectTimeout, KeepAliveConfig: keepAlive}
		c, err := d.Dial("tcp", t.Addr.String())
		if err == nil {
			t.B.PassiveOK()
			return c.(*net.TCPConn), t, tries, nil
		}
		t.B.Release()
		t.B.ConnectFailed()
		t.B.PassiveFail(t.MaxFails, t.FailTimeout, time.Now())
		tries++
		last = err
		s.log.Warn().Err(err).Str("service", svc.Name).Str("backend", t.B.Name).Msg("connect failed")
	}
	return nil, nil, tries, last
}

// errFull: every eligible backend, or the service, is at its max_conns.
var errFull = errors.New("every eligible backend is full")

// up reports whether a backend could take the connection but for its
// max_conns: one with weight, neither down nor draining, not yet tried.
// O(n), on the refusal path only.
func up(ts []sched.Target, r *sched.Request) bool {
	for i := range ts {
		if t := &ts[i]; t.Weight > 0 && !t.B.Down() && !t.B.Draining() && !r.Tried(i) {
			return true
		}
	}
	return false
}

// full reports whether a backend that could take the connection exists but
// is at its max_conns: then the connection may queue. O(n), on the refusal
// path only.
func full(ts []sched.Target, r *sched.Request) bool {
	for i := range ts {
		t := &ts[i]
		if t.Weight > 0 && t.MaxConns > 0 && !t.B.Down() && !t.B.Draining() && !r.Tried(i) && t.B.Active() >= int64(t.MaxConns) {
			return true
		}
	}
	return false
}

// admit takes a service slot (svc.MaxConns), waiting up to svc.QueueTimeout
// for one. It reports false when the connection must be refused.
func admit(svc *sched.Service, start time.Time) bool {
	g := svc.Group
	if g.Acquire(svc.MaxConns) {
		return true
	}
	if svc.QueueTimeout <= 0 {
		return false
	}
	w := g.Enqueue()
	defer w.Leave()
	for {
		wake := g.Wake()
		if g.Acquire(svc.MaxConns) {
			return true
		}
		if !w.Wait(wake, start.Add(svc.QueueTimeout)) {
			return false
		}
	}
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
	ss.svc.Group.Release()
	ss.svc.Group.ReleaseSource(ss.addr.Addr(), ss.svc.MaxConnsPerSource)
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
