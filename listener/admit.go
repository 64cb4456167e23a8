package listener

// Admission: what happens to an accepted connection before its session
// starts — screen (PROXY header, access lists, rate), per-source and service
// slots, pick, dial with retries — and the access line every connection ends
// with. One connection's way through it is one value, an inbound; the
// service's state it is admitted against is its admission (admission.go).
// The session itself (copying bytes both ways) is in session.go.

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/backend"
	"fulcrum/internal/sockfd"
	"fulcrum/internal/wire"
	"fulcrum/sched"
)

// handle admits one accepted connection and starts its session, or ends
// it. It holds one count of s.wg, which a successful dial hands on to the
// session, which runs in an event loop (loop.go) until it finishes itself.
// What the connection holds (its place under the connection limit, source,
// service and backend slots) is one lease: whoever ends the connection
// releases it, once. What the steps share is one inbound.
//
// handle runs in its accept loop's goroutine (i is not nil), and before
// anything that may wait hands the loop on (handOff): a PROXY header or a
// name to route by, a queue, a hold, a connect not done at once. It then
// goes on in the goroutine it was called in, which ends with it.
func (s *Server) handle(c int, peer, key netip.AddrPort, inh inherited, i *inline) {
	defer s.admitting.end() // begun by the accept loop (server.go)
	// The request escapes (Pick is an interface call): on the heap alone,
	// it leaves in on the stack.
	in := &inbound{c: c, key: key, r: new(sched.Request), l: lease{srv: s}}
	in.start = time.Now()
	snap := s.tbl.Load()
	// On an address routed by name, any of its services until the route is
	// chosen: they agree on what comes before (keepalive aside, set again).
	if in.svc = snap.Route(key); in.svc == nil { // the listener is being closed by a reload
		in.drop()
		return
	}
	in.pol = snap.Policy(in.svc)
	rs := snap.Routes(key) // nil: not routed by name
	if len(in.pol.AcceptProxy) > 0 || in.pol.QueueTimeout > 0 || rs != nil {
		s.handOff(i) // a header or a name to wait for, or a queue
	}
	if err := inh.setKeepAlive(c, keepAliveFor(in.pol)); err != nil { // a socket that takes no option is not worth serving
		s.log.Warn().Err(err).Str("service", in.svc.Name).Msg("accepted connection")
		in.drop()
		return
	}
	if err := setUserTimeoutFD(c, in.pol.UserTimeout); err != nil {
		s.log.Warn().Err(err).Str("service", in.svc.Name).Msg("cannot set user_timeout on the client socket")
	}
	in.r.Client = unmap(peer)
	in.orig = localAddr(c, key) // the address the client asked for
	if why, err := s.proxyHeader(in.pol, c, &in.r.Client, &in.orig); err != nil {
		s.reject(in, why, err)
		return
	}
	in.addr = in.r.Client
	if in.pol.Postgres && rs == nil && s.cancelled(c, key, in.pol, in.addr, in.start, i) { // a CancelRequest: forwarded (cancel.go)
		in.l.release()
		return
	}
	in.tm.viewAt = in.start
	if rs != nil && !s.routeIn(in, rs, snap) {
		return
	}
	in.adm = s.adm.get(in.svc.Name)
	if why, err := screen(in.adm, in.pol, in.addr); err != nil {
		s.reject(in, why, err)
		return
	}
	if refusesSplitBrain(in.svc) { // counted here, logged once per split (by reload), not per connection
		in.adm.rejects.add(RejectSplitBrain)
		in.drop()
		return
	}
	if !in.l.holdSource(in.adm, in.addr.Addr(), in.pol.MaxConnsPerSource) {
		s.reject(in, RejectPerSource, fmt.Errorf("%d connections from %s already", in.pol.MaxConnsPerSource, in.addr.Addr()))
		return
	}
	if !in.l.holdService(in.pol, in.start, c, &in.tm) {
		if in.tm.waited && clientGone(c) {
			s.fail(in, nil, endGone, errClientGone)
			return
		}
		in.adm.rejects.add(RejectFull)
		s.fail(in, nil, endFull, errFull)
		return
	}
	ready := toBackend(in.h, in.pol, in.addr, in.orig)
	bc, t, err := s.connect(in, ready, i)
	if err != nil && in.pol.HoldTimeout > 0 && !errors.Is(err, errFull) && !errors.Is(err, errClientGone) {
		s.handOff(i)
		bc, t, err = s.connectHeld(in, ready)
	}
	if err != nil {
		end := endConnect
		switch {
		case errors.Is(err, errClientGone):
			end = endGone
		case errors.Is(err, errFull):
			end = endFull
			in.adm.rejects.add(RejectFull)
		case errors.Is(err, sched.ErrNoBackend) && in.tm.retries == 0:
			end = endNoBackend
		}
		s.fail(in, nil, end, err)
		return
	}
	in.l.b = t.B                                   // connect took its slot
	if t.ProxyProtocol > 0 && !postgresTLS(in.h) { // such a backend had its header before its SSLRequest
		if err := wire.WriteHeader(fdWriter(bc), t.ProxyProtocol, in.addr, in.orig); err != nil {
			sockfd.Close(bc)
			s.fail(in, t, endReset, fmt.Errorf("send PROXY header: %w", err))
			return
		}
	}
	ss := newSession(s, in, t, bc)
	seamAt(seamPicked, ss)
	ok, cut := t.B.TrackSince(ss, in.tm.viewAt)
	if !ok { // the backend's drain deadline has passed
		ss.drained.Store(true)
		ss.release() // admission's count, the only one: finish
		return
	}
	seamAt(seamTracked, ss)
	// Cut closes what is tracked, and this session was not yet when a Cut
	// ran after its table was loaded (on_role_change, a split brain,
	// on_up, on_down): TrackSince says so, and it ends as that Cut's
	// sessions did. on_down = "close": the backend's state is set before
	// its Cut runs, and Track and Cut take the same lock: either that Cut
	// sees this session, or this sees the state.
	switch {
	case cut != "":
		ss.Cut(cut)
	case t.CutOnDown && t.B.Down():
		t.B.Cut(backend.CutDown)
	}
	ss.run()
}

// inbound is one connection on its way through admission, from its accept
// to its session or its end: what handle's steps share, in place of a
// dozen parameters each. Only the connection's goroutine touches it.
type inbound struct {
	accessInfo                // what its access line says; its session takes it over
	c          int            // the client's socket
	key        netip.AddrPort // the listen address it came in on
	adm        *admission     // svc's admission state; nil until the route is chosen
	r          *sched.Request // the client (addr, once the PROXY header is read) and the backends tried
	orig       netip.AddrPort // the address the client asked for (a PROXY header's destination)
	h          *wire.Hello    // what the client sent first, on an address routed by name (routes.go); nil else
	l          lease
}

// accessInfo is what a connection's access line says besides its backend,
// its bytes and how it ended: admission fills it in, and the session
// carries it on.
type accessInfo struct {
	svc   *sched.Service // its service, in the table its backend was picked from
	pol   *Policy        // and that service's policy
	addr  netip.AddrPort // the client's
	sni   string         // the server name it sent, on an address routed by name
	start time.Time      // the accept
	tm    timing
}

// routeIn chooses in's service by the name its client sends first, on an
// address routed by name (rs, in snapshot snap). false: the connection was
// refused, counted and closed.
func (s *Server) routeIn(in *inbound, rs *sched.Routes, snap *Snapshot) bool {
	first := in.pol
	if in.svc, in.h = s.route(in.c, in.key, rs, in.addr); in.svc == nil {
		in.l.release() // refused, counted and closed
		return false
	}
	// The client's first bytes may have come after a reload: its route
	// stands, taken in the current table, and one the reload removed is
	// chosen again there (its service's backends drain; a new connection
	// is not theirs), as a client arriving now would be.
	if at, cur := time.Now(), s.tbl.Load(); cur != snap {
		name := in.svc.Name
		if in.svc = reroute(cur.Table, in.key, name, in.h); in.svc == nil {
			s.refuse(in.c, in.key, in.addr, in.h.SNI, &wire.Error{Reason: ReasonNoRoute, Err: errNoRoute})
			in.l.release()
			return false
		}
		snap, in.tm.viewAt = cur, at
	}
	in.pol, in.sni = snap.Policy(in.svc), helloSNI(in.h)
	routed(in.c, first, in.pol)
	return true
}

// reject turns in away before any dial, for why: counted (before the
// close, so that a client that sees the close also sees the count) and
// logged at most once a second per service.
func (s *Server) reject(in *inbound, why Reject, err error) {
	if total, suppressed, log := s.adm.get(in.svc.Name).rejects.add(why); log {
		s.log.Warn().Str("service", in.svc.Name).Stringer("client", in.r.Client).Err(err).
			Stringer("reason", why).Uint64("rejected_so_far", total).Uint64("suppressed", suppressed).Msg("connection rejected")
	}
	in.drop()
}

// drop ends in with no access line: its client socket is closed and its
// lease given back.
func (in *inbound) drop() {
	sockfd.Close(in.c)
	in.l.release()
}

// fail ends in for end (t: the backend that took it, nil when none did;
// then it is counted as unserved, before the close) with its access line.
func (s *Server) fail(in *inbound, t *sched.Target, end string, err error) {
	if t == nil {
		in.adm.unservedFor(end)
	}
	sockfd.Close(in.c)
	in.l.release(func() { s.access(&in.accessInfo, t, 0, 0, end, err) })
}

// lease is what one connection holds while it lives: its place under the
// Server's connection limit (always), then a source slot and a service
// slot in its service's admission state, and its backend's slot. release
// gives back all that it holds, once, whoever ends the connection.
type lease struct {
	srv     *Server
	a       *admission       // the service's, whose source and service slots it holds
	src     netip.Addr       // the source slot's address
	perSrc  int              // and its limit; 0: no source slot is held
	service bool             // a service slot is held in a
	b       *backend.Backend // whose slot is held; nil: none
}

// holdSource takes a slot for client address ip in a, under a limit of max
// connections at once (0: unlimited, nothing to hold); false when ip is at it.
func (l *lease) holdSource(a *admission, ip netip.Addr, max int) bool {
	if !a.acquireSource(ip, max) {
		return false
	}
	l.a, l.src, l.perSrc = a, ip, max
	return true
}

// holdService takes a slot of the service (pol.MaxConns) in the group the
// source slot is in, waiting up to pol.QueueTimeout from start for one
// (and marking tm waited), unless the client of socket c leaves
// meanwhile. It reports false when the connection must be refused.
func (l *lease) holdService(pol *Policy, start time.Time, c int, tm *timing) bool {
	ok := l.a.acquire(pol.MaxConns)
	if !ok && pol.QueueTimeout > 0 {
		tm.waited = true
		ok = l.a.admit(pol.MaxConns, start.Add(pol.QueueTimeout), goneEvery, func() bool { return clientGone(c) })
	}
	l.service = ok
	return ok
}

// release gives back every slot l holds, then runs each of last (the
// access line: whoever reads it sees the slots free), then ends the
// connection's count under the Server's limit and in its WaitGroup (so
// that Wait returns only once the line is written).
func (l *lease) release(last ...func()) {
	if l.b != nil {
		l.srv.releaseBackend(l.b) // wakes a connection queued for its slot
		l.b = nil
	}
	if l.service {
		l.a.release()
		l.service = false
	}
	if l.perSrc != 0 {
		l.a.releaseSource(l.src, l.perSrc)
		l.perSrc = 0
	}
	for _, f := range last {
		f()
	}
	l.srv.connDone()
}

// screen applies what else is decided before any backend is dialled: the
// access lists and the accept rate. It returns why when the connection
// must go.
func screen(a *admission, pol *Policy, client netip.AddrPort) (Reject, error) {
	if !pol.Allowed(client.Addr()) {
		return RejectDenied, errors.New("denied by allow/deny")
	}
	if !a.allowAccept() {
		return RejectRate, errors.New("over accept_rate")
	}
	return 0, nil
}

// connect picks and dials backends for in until one answers, trying at
// most in.pol.Retries more after the first failure and never one backend
// twice. It picks from the primaries, or from the backups while no primary
// is up. When every eligible backend is full it waits up to
// in.pol.QueueTimeout from the accept for a slot (errFull after that, or
// at once without a queue). It returns the backend's socket and target;
// in.tm.retries counts the dials that failed. ready, if not nil, prepares
// each connected backend before it is taken (routes.go): one it fails
// counts as a failed dial. il, if not nil, is handed off before a dial
// waits (handOff). A connection that waited (tm.waited) looks, before each
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

// localError reports whether a dial failed for want of a local resource:
// descriptors (EMFILE, ENFILE), kernel memory (ENOBUFS, ENOMEM), local
// ports (EADDRNOTAVAIL), the socket could not be made at all, or not bound
// to the client's address (source = "client": transparent.go).
func localError(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.EADDRNOTAVAIL, ErrNoTransparent, errSourceFamily} {
		if errors.Is(err, e) {
			return true
		}
	}
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == "socket"
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

// logsAccess reports whether access would write a line for a service of policy pol now.
func (s *Server) logsAccess(pol *Policy) bool {
	level := zerolog.DebugLevel
	if pol.AccessLog {
		level = zerolog.InfoLevel
	}
	return level >= s.log.GetLevel() && level >= zerolog.GlobalLevel()
}

// timing is what the access line says about the way to a backend, after
// HAProxy's tcplog timers: the session carries it from connect to finish.
type timing struct {
	queue   time.Duration // accept to the first dial (Tw): the service and backend queues, admission
	connect time.Duration // the successful dial (Tc)
	retries int           // dials that failed before it
	dialled int8          // 1 once a dial began: queue is set
	held    bool          // the connection is held (hold_timeout): its redials are no passive failures (hold.go)
	waited  bool          // it waited (a queue, a hold): it looks whether its client left before a dial (gone.go)
	viewAt  time.Time     // taken before the table its backend was picked from was loaded (backend.TrackSince)

	roleEpoch uint64 // its backend's RoleEpoch just before the dial that connected
}

// RoleEpoch is the backend's role epoch when the session was dialled: a
// role change seen since then ends it, one seen before does not
// (backend.CutRole, on_role_change).
func (ss *session) RoleEpoch() uint64 { return ss.tm.roleEpoch }

// access writes the access line of a connection that ended as end (err
// the error that ended it): ai says which, t its backend (nil: none took
// it), in and out the bytes each way.
func (s *Server) access(ai *accessInfo, t *sched.Target, in, out int64, end string, err error) {
	svc, pol, tm := ai.svc, ai.pol, &ai.tm
	var e *zerolog.Event
	if pol.AccessLog {
		e = s.log.Info()
	} else {
		e = s.log.Debug()
	}
	if e == nil {
		return
	}
	e = e.Str("service", svc.Name).Stringer("client", ai.addr)
	if ai.sni != "" {
		e = e.Str("sni", ai.sni)
	}
	if t != nil {
		e = e.Str("backend", t.B.Name).Stringer("backend_addr", t.Addr)
		if t.B.Service != svc.Name { // picked from its fallback's backends
			e = e.Str("fallback", t.B.Service)
		}
	}
	if tm.dialled != 0 {
		e = e.Float64("queue_ms", ms(tm.queue))
	}
	if t != nil {
		e = e.Float64("connect_ms", ms(tm.connect))
	}
	e = e.Int("retries", tm.retries).Int64("bytes_in", in).Int64("bytes_out", out).Float64("duration_ms", float64(time.Since(ai.start).Microseconds())/1000).Str("end", end)
	if err != nil && end != endClient && end != endBackend {
		e = e.AnErr("error", err)
	}
	e.Msg("connection")
}

// withFallback adds to e, a line about backend t of a connection to svc,
// the service t belongs to, as "fallback", when t was picked from svc's
// fallback's backends (service names the one the client asked for), as
// the access line does.
func withFallback(e *zerolog.Event, svc *sched.Service, t *sched.Target) *zerolog.Event {
	if t.B.Service != svc.Name {
		e = e.Str("fallback", t.B.Service)
	}
	return e
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
