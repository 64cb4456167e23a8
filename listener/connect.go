package listener

// Connecting a connection to a backend: connect picks and dials with
// retries; connectHeld holds a connection no backend can take yet
// (hold_timeout) and connects it once one can; dial makes the raw,
// non-blocking connect, whose wait is in an event loop (await, loop.go),
// never in a thread of its own.
//
// What admission does for databases in a switchover: refuse while a
// primary service sees a split brain, fall back to another service's
// backends while none of the service's own is eligible, and hold a
// connection (hold_timeout) until a backend becomes eligible instead of
// closing it.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
	"fulcrum/sched"
)

// connect picks and dials backends for in until one answers, trying at
// most in.pol.Retries more after the first failure and never one backend
// twice. It picks from the primaries, or from the backups while no primary
// is up. When every eligible backend is full it waits up to
// in.pol.QueueTimeout from the accept for a slot (errFull after that, or
// at once without a queue). It returns the backend's socket and target;
// in.tm.retries counts the dials that failed. ready, if not nil, prepares
// each connected backend before it is taken (routes.go): one it fails
// counts as a failed dial. il, if not nil, is detached before a dial
// waits (detach). A connection that waited (tm.waited) looks, before each
// dial, whether its client left meanwhile: errClientGone (gone.go).
func (s *Server) connect(in *inbound, ready func(int, *sched.Target) error, il *inline) (bc int, t *sched.Target, err error) {
	c, svc, pol, r, tm := in.c, in.svc, in.pol, in.r, &in.tm
	var last error = sched.ErrNoBackend
	tm.retries = 0
	targets, picker := pool(svc)
	spins := 0
	var w *place
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	for tm.retries <= pol.Retries {
		i, err := picker.Pick(r)
		if err != nil {
			if tm.retries > 0 || !up(targets, r) {
				return -1, nil, last // nothing is up: close at once
			}
			if spins < 3 && !full(targets, r) {
				spins++ // a slot freed between the pick and now: pick again
				continue
			}
			if pol.QueueTimeout <= 0 {
				return -1, nil, errFull
			}
			if w == nil {
				w = in.adm.enqueue()
				tm.waited = true
				continue // try once more, now that a freed slot will wake us
			}
			woken, gone := waitWatching(c, in.start.Add(pol.QueueTimeout), w.wait)
			if gone {
				return -1, nil, errClientGone
			}
			if !woken {
				return -1, nil, errFull
			}
			continue
		}
		if tm.waited && clientGone(c) {
			return -1, nil, errClientGone
		}
		t := &targets[i]
		if !t.B.Acquire(t.MaxConns) {
			// Full or draining since the pick: not a failure, and not tried
			// (the next pick skips it while it is full, takes it once free).
			if spins++; spins > 64 {
				return -1, nil, errFull
			}
			continue
		}
		if !r.MarkTried(i) {
			s.releaseBackend(t.B)
			return -1, nil, last
		}
		if tm.retries > 0 {
			in.adm.retries.Add(1)
		}
		tm.roleEpoch = t.B.RoleEpoch() // before the dial: a role change seen from here on cuts it (backend.CutRole)
		d0 := time.Now()
		if tm.dialled == 0 {
			tm.queue, tm.dialled = d0.Sub(in.start), 1
		}
		bc, err := s.dial(pol, t.Addr, r.Client.Addr(), il)
		if err == nil && ready != nil {
			if err = ready(bc, t); err != nil {
				sockfd.Close(bc)
			}
		}
		if err == nil {
			tm.connect = time.Since(d0)
			t.B.PassiveOK()
			return bc, t, nil
		}
		s.releaseBackend(t.B)
		if localError(err) {
			// fulcrum's own shortage (descriptors, buffers, ports), not the
			// backend's fault: never counted against it, and no other
			// backend would fare better now.
			withFallback(s.log.Warn().Err(err).Str("service", svc.Name).Str("backend", t.B.Name), svc, t).Stringer("client", r.Client).Bool("local", true).
				Bool("retry", false).Msg("connect failed")
			return -1, nil, err
		}
		t.B.ConnectFailed()
		if !tm.held {
			t.B.PassiveFail(t.MaxFails, t.FailTimeout, time.Now())
		}
		tm.retries++
		last = err
		withFallback(s.log.Warn().Err(err).Str("service", svc.Name).Str("backend", t.B.Name), svc, t).Stringer("client", r.Client).
			Bool("retry", tm.retries <= pol.Retries).Msg("connect failed") // retry: another backend is tried, if one is eligible
	}
	return -1, nil, last
}

// localError reports whether a dial failed for want of a local resource
// (sockfd.LocalError: descriptors, kernel memory, local ports, a socket
// not made), or the socket could not be bound to the client's address
// (source = "client": transparent.go).
func localError(err error) bool {
	return sockfd.LocalError(err) || errors.Is(err, ErrNoTransparent) || errors.Is(err, errSourceFamily)
}

// errFull: every eligible backend, or the service, is at its max_conns.
var errFull = errors.New("every eligible backend is full")

// up reports whether a backend could take the connection but for its
// max_conns: one with weight, neither down nor draining, not yet tried.
// O(n), on the refusal path only.
func up(ts []sched.Target, r *sched.Request) bool {
	for i := range ts {
		if t := &ts[i]; t.Up() && !r.Tried(i) {
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
		if t.Up() && t.Full() && !r.Tried(i) {
			return true
		}
	}
	return false
}

// errSplitBrain: the service refuses while more than one backend claims
// the primary role and none is kept as the writer (split_brain =
// "refuse", or "newest" with a tie).
var errSplitBrain = fmt.Errorf("split brain: more than one backend claims the primary role (%w)", sched.ErrNoBackend)

// refusesSplitBrain reports whether svc turns new connections away now: a
// split brain with no writer kept (sched.Service.SplitWriter). The table
// says so; the policy has no part in it.
func refusesSplitBrain(svc *sched.Service) bool {
	return len(svc.SplitBrain) > 0 && svc.SplitWriter == ""
}

// pool returns the targets a connection picks from: the service's own,
// or its fallback's while none of its own is up (sched.Service.Serving).
func pool(svc *sched.Service) ([]sched.Target, sched.Picker) {
	if svc.Fallback == nil { // its own either way: no walk over its targets per connection
		return svc.Pool()
	}
	_, ts, p := svc.Serving()
	return ts, p
}

// eligibleNow reports whether a connection to svc could be dialled now:
// some backend of its pool (or its fallback's) is up.
func eligibleNow(svc *sched.Service) bool {
	var none sched.Request
	ts, _ := pool(svc)
	return up(ts, &none)
}

// connectHeld is connect for a service with hold_timeout once connect found
// no eligible backend, or dialled every one it could and failed (a node
// that just died, before its checks say so): nothing has been sent to a
// backend yet, so it waits in the service's hold queue, up to hold_timeout
// from its accept, and tries again each time it is woken with a backend
// eligible: by a new table (a check changed a state, a passive mark
// lapsed, a reload added a backend) or by any passing check of one of the
// service's backends (Server.Kick), since a node
// back within fall × interval never changes state and no table would
// wake it. It connects through the current table's service, which it
// leaves in in with its policy. The connection keeps the service slot it holds,
// so max_conns bounds the waiting too. A listener removed meanwhile ends
// the wait, and so does its client leaving (gone.go), which it looks for
// while it waits and before each redial.
//
// Its redials are not passive failures (tm.held): they are the same
// client trying the same nodes again at the pace of the checks, not new
// evidence, and counting them marked a node down that was coming back,
// adding rise × interval to its return. The first dial of every connection
// still counts, so new clients still mark a dead node down.
func (s *Server) connectHeld(in *inbound, ready func(int, *sched.Target) error) (bc int, t *sched.Target, err error) {
	a := in.adm
	a.hold.held.Add(1)
	in.tm.held, in.tm.waited = true, true
	deadline := in.start.Add(in.pol.HoldTimeout)
	tried := in.svc // the table (its service) the last connect failed in
	woke := false   // woken since that connect failed: a new table or a passing check
	for {
		in.tm.retries = 0 // a return but connect's has no failed dial to count
		h := a.join()
		viewAt := time.Now()
		snap := s.tbl.Load() // after join: a snapshot published, or a check passing, from here on kicks us
		cur := serviceAt(snap.Table, in.key, in.svc.Name)
		if cur == nil {
			h.leave()
			return -1, nil, sched.ErrNoBackend
		}
		curPol := snap.Policy(cur)
		// Wait while nothing is eligible, or until something happened
		// since the backends of this table just failed. A split brain
		// ends the wait at once.
		if (cur == tried && !woke || !eligibleNow(cur)) && !refusesSplitBrain(cur) {
			ok, gone := waitWatching(in.c, deadline, h.wait)
			h.leave()
			if gone {
				return -1, nil, errClientGone
			}
			if !ok {
				a.hold.expired.Add(1)
				return -1, nil, errHoldExpired
			}
			woke = true
			continue
		}
		h.leave()
		in.svc, in.pol, in.tm.viewAt = cur, curPol, viewAt
		if refusesSplitBrain(cur) {
			return -1, nil, errSplitBrain
		}
		*in.r = sched.Request{Client: in.r.Client} // a new table, or a backend that failed may be back
		bc, t, err := s.connect(in, ready, nil)
		if err == nil || errors.Is(err, errFull) || errors.Is(err, errClientGone) || time.Now().After(deadline) {
			return bc, t, err
		}
		tried, woke = cur, false
	}
}

// errHoldExpired: no backend became eligible within hold_timeout.
var errHoldExpired = fmt.Errorf("hold_timeout passed: %w", sched.ErrNoBackend)

// dial connects to a backend of a service of policy pol: a non-blocking
// connect on a raw socket with TCP_NODELAY and pol's user timeout (its
// keepalive comes later, from the session: lateKeepAlive), from client's
// address when pol says so (pol.SourceClient, transparent.go), then a wait
// of at most pol.ConnectTimeout (0: none) for its outcome. A connect that
// is not done at once (always so but on loopback) waits in an event loop's
// epoll, never in a thread of its own; before it waits, i (if not nil) is
// detached.
func (s *Server) dial(pol *Policy, a netip.AddrPort, client netip.Addr, i *inline) (int, error) {
	fd, err := s.connectRaw(pol, a, client, i)
	if err != nil {
		return -1, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(a), Err: err}
	}
	return fd, nil
}

func (s *Server) connectRaw(pol *Policy, a netip.AddrPort, client netip.Addr, i *inline) (int, error) {
	family := unix.AF_INET
	if !a.Addr().Unmap().Is4() {
		family = unix.AF_INET6
	}
	fd, err := sockfd.Socket(family)
	if err != nil {
		return -1, err
	}
	if err := setDialOpts(fd, pol); err != nil {
		sockfd.Close(fd)
		return -1, err
	}
	if pol.SourceClient {
		if err := bindClient(fd, client, a); err != nil {
			sockfd.Close(fd)
			return -1, err
		}
	}
	switch err := sockfd.Connect(fd, a); err {
	case nil:
		return fd, nil
	case unix.EINPROGRESS, unix.EALREADY:
	default:
		sockfd.Close(fd)
		return -1, err
	}
	switch writable(fd) {
	case connUp:
		return fd, nil
	case connPending:
		s.detach(i)
		if err := s.awaitConnect(fd, pol.ConnectTimeout); err != nil {
			sockfd.Close(fd)
			return -1, err
		}
	}
	if err := sockfd.ConnectError(fd); err != nil {
		sockfd.Close(fd)
		return -1, err
	}
	return fd, nil
}

// connState is what a connect in progress has come to.
type connState uint8

const (
	connPending connState = iota // no outcome yet
	connUp                       // established
	connFailed                   // failed: SO_ERROR says why
)

// writable tells whether fd's connect has an outcome: on loopback it has
// by the time connect returns, whose backlog is processed before it does.
// Writable without error or hang-up is up, with no SO_ERROR to ask.
func writable(fd int) connState {
	switch ev := sockfd.Poll(fd, unix.POLLOUT); {
	case ev == 0:
		return connPending
	case ev&(unix.POLLERR|unix.POLLHUP) != 0:
		return connFailed
	}
	return connUp
}

// awaitConnect waits until fd, a connect in progress, is writable (the
// connection is up or failed) or timeout passes, in one of s's loops. The
// session later registers fd again for its own events, in whichever loop it
// runs.
//
// A wake-up is looked at again (writable): an event harvested in a batch
// for an earlier use of fd's number, closed meanwhile and its number given
// to this socket, wakes the wait as well, and SO_ERROR is 0 in SYN_SENT.
// While the connect is still in progress it waits again, in the same loop,
// to the same deadline.
func (s *Server) awaitConnect(fd int, timeout time.Duration) error {
	lp, err := s.loop()
	if err != nil {
		return err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	registered := false
	for {
		if err := lp.await(fd, unix.EPOLLOUT, deadline, &registered); err != nil {
			return err
		}
		if writable(fd) != connPending {
			return nil
		}
	}
}

// setDialOpts gives a new socket to be connected what a Go net.Conn has
// (TCP_NODELAY), SO_OOBINLINE (a backend's urgent byte stays in the stream,
// as a client's does: setNoDelay), and pol's user timeout, set before the
// connect so that it bounds the handshake's retransmissions too. What a new
// socket has already (keepalive off, the kernel's user timeout) is not set
// again. Keepalive is not set here: a session's backend socket gets it once
// the session has lived keepAliveAfter (lateKeepAlive), and a cancel
// request's connection lives a few seconds at most (cancelTimeout).
func setDialOpts(fd int, pol *Policy) error {
	if err := sockfd.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return err
	}
	if err := sockfd.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil {
		return err
	}
	return setUserTimeoutFD(fd, pol.UserTimeout)
}

// setUserTimeoutFD sets TCP_USER_TIMEOUT on fd (usertimeout.go); d <= 0
// leaves it unset.
func setUserTimeoutFD(fd int, d time.Duration) error {
	if set := userTimeout(d); set != nil {
		return set("", "", fdRawConn(fd))
	}
	return nil
}

// fdRawConn is a raw descriptor as a syscall.RawConn, for the option
// setters written for one; it can only Control.
type fdRawConn int

func (c fdRawConn) Control(f func(fd uintptr)) error { f(uintptr(c)); return nil }

func (fdRawConn) Read(func(fd uintptr) (done bool)) error { return errors.ErrUnsupported }

func (fdRawConn) Write(func(fd uintptr) (done bool)) error { return errors.ErrUnsupported }

// fdWriter writes to a connected non-blocking socket that can take what is
// written at once (the PROXY header into a fresh connection); a full socket
// is an error, not a wait.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := sockfd.Send(int(w), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}
