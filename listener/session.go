package listener

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

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

// handle serves one accepted connection from start to end.
func (s *Server) handle(c *net.TCPConn, key netip.AddrPort) {
	defer s.wg.Done()
	start := time.Now()
	svc := s.tbl.Load().Route(key)
	if svc == nil { // the listener is being closed by a reload
		c.Close()
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
	if kind, err := s.screen(svc, c, &r.Client, &orig); err != nil {
		svc.Group.Reject(kind, func(total uint64) {
			s.log.Warn().Str("service", svc.Name).Stringer("client", r.Client).Err(err).
				Str("reason", backend.RejectNames[kind]).Uint64("rejected_so_far", total).Msg("connection rejected")
		})
		c.Close()
		return
	}
	if !svc.Group.AcquireSource(r.Client.Addr(), svc.MaxConnsPerSource) {
		svc.Group.Reject(backend.RejectPerSource, func(total uint64) {
			s.log.Warn().Str("service", svc.Name).Stringer("client", r.Client).Int("max_conns_per_source", svc.MaxConnsPerSource).
				Str("reason", "per_source").Uint64("rejected_so_far", total).Msg("connection rejected")
		})
		c.Close()
		return
	}
	defer svc.Group.ReleaseSource(r.Client.Addr(), svc.MaxConnsPerSource)
	if !admit(svc, start) {
		svc.Group.Refused()
		c.Close()
		s.access(svc, r.Client, nil, start, 0, 0, endFull, errFull)
		return
	}
	defer svc.Group.Release()
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
		c.Close()
		s.access(svc, r.Client, nil, start, 0, 0, end, err)
		return
	}
	if t.ProxyProtocol > 0 {
		if err := writeHeader(bc, t.ProxyProtocol, r.Client, orig); err != nil {
			c.Close()
			bc.Close()
			t.B.Release()
			s.access(svc, r.Client, t, start, 0, 0, endReset, fmt.Errorf("send PROXY header: %w", err))
			return
		}
	}
	ss := &session{client: c, backend: bc, idle: svc.IdleTimeout}
	if t.B.Track(ss) {
		ss.run()
		t.B.Untrack(ss)
	} else { // the backend's drain deadline has passed
		ss.drained.Store(true)
		ss.closeBoth()
	}
	t.B.Release()
	t.B.AddBytes(ss.up.n, ss.down.n)
	s.access(svc, r.Client, t, start, ss.up.n, ss.down.n, ss.end(), ss.firstErr())
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
			if tries > 0 || !full(targets, r) {
				return nil, nil, tries, last // nothing is up: close at once
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
		if !r.MarkTried(i) {
			return nil, nil, tries, last
		}
		t := &targets[i]
		if !t.B.Acquire(t.MaxConns) { // draining or full since the pick: not a failure
			continue
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

// session is one proxied connection after a successful dial.
type session struct {
	client, backend *net.TCPConn
	idle            time.Duration // 0 = none

	up   half // client → backend
	down half // backend → client

	first   atomic.Int32 // which half reached EOF first: 1 up, 2 down
	err     atomic.Pointer[error]
	drained atomic.Bool
}

// half is one direction of a session.
type half struct {
	src, dst *net.TCPConn
	n        int64        // bytes copied; written by the half's own goroutine, read after it ends
	last     atomic.Int64 // unix nanoseconds of the last progress seen (idle timeout only)
	poked    atomic.Bool  // the other half asks this one to report its progress
	done     atomic.Bool  // the half has returned
}

var errIdle = errors.New("idle timeout")

// Close closes both sockets; the session then ends as drained. It lets a
// backend's drain deadline close a session it tracks.
func (ss *session) Close() error {
	ss.drained.Store(true)
	ss.closeBoth()
	return nil
}

func (ss *session) closeBoth() {
	ss.client.Close()
	ss.backend.Close()
}

// run copies both ways until both directions have ended, then closes both
// sockets. One direction runs in a new goroutine, which run waits for.
func (ss *session) run() {
	ss.up.src, ss.up.dst = ss.client, ss.backend
	ss.down.src, ss.down.dst = ss.backend, ss.client
	if ss.idle > 0 {
		now := time.Now().UnixNano()
		ss.up.last.Store(now)
		ss.down.last.Store(now)
	}
	done := make(chan struct{})
	go ss.pipe(&ss.down, &ss.up, 2, done) // exits when the backend→client direction ends
	ss.pipe(&ss.up, &ss.down, 1, nil)
	<-done
	ss.closeBoth()
}

// pipe runs one direction. A clean EOF is passed on as a FIN (CloseWrite)
// and the other direction keeps flowing; an error closes both sockets so
// that the other direction ends too.
func (ss *session) pipe(h, o *half, id int32, done chan<- struct{}) {
	err := ss.copy(h, o)
	h.done.Store(true)
	if err == nil {
		ss.first.CompareAndSwap(0, id)
		h.dst.CloseWrite()
	} else {
		ss.err.CompareAndSwap(nil, &err)
		ss.closeBoth()
	}
	if done != nil {
		close(done)
	}
}

// copy moves bytes from h.src to h.dst. Both are *net.TCPConn on purpose:
// io.Copy then reaches TCPConn.ReadFrom, which splices in the kernel.
// Wrapping either conn (a counting reader, a bufio) would silently fall back
// to a userspace copy.
//
// With an idle timeout, each direction waits with a read deadline. When it
// expires with no progress anywhere known, the half asks the other to report
// (an immediate deadline, "poke"), since bytes moving inside the other's
// io.Copy are not visible until it returns; the poked half, knowing both
// sides, gives the verdict.
func (ss *session) copy(h, o *half) error {
	if ss.idle <= 0 {
		n, err := io.Copy(h.dst, h.src)
		h.n += n
		return err
	}
	deadline := time.Now().Add(ss.idle)
	for {
		h.src.SetReadDeadline(deadline)
		var n int64
		var err error
		poked := h.poked.Swap(false)
		if poked {
			err = os.ErrDeadlineExceeded // a poke that our own SetReadDeadline overwrote
		} else {
			n, err = io.Copy(h.dst, h.src)
			poked = h.poked.Swap(false)
		}
		h.n += n
		now := time.Now()
		if n > 0 {
			h.last.Store(now.UnixNano())
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		last := time.Unix(0, max(h.last.Load(), o.last.Load()))
		switch {
		case now.Sub(last) < ss.idle:
			deadline = last.Add(ss.idle)
		case poked || o.done.Load():
			return errIdle
		default:
			o.poked.Store(true)
			o.src.SetReadDeadline(time.Unix(1, 0))
			deadline = now.Add(ss.idle)
		}
	}
}

// firstErr is the error that ended the session, or nil.
func (ss *session) firstErr() error {
	if p := ss.err.Load(); p != nil {
		return *p
	}
	return nil
}

// end says how the session ended.
func (ss *session) end() string {
	if ss.drained.Load() {
		return endDrained
	}
	if p := ss.err.Load(); p != nil {
		if errors.Is(*p, errIdle) {
			return endIdle
		}
		return endReset
	}
	if ss.first.Load() == 2 {
		return endBackend
	}
	return endClient
}
