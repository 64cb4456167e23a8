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
	"time"

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
// releases it, once. What the steps share is one inbound; each step ends
// the connection itself when it reports false.
//
// handle runs where the connection was accepted (i is not nil: an event
// loop's goroutine, or its socket's accept goroutine), and before
// anything that may wait detaches from the loop (detach): a PROXY header or a
// name to route by, a queue, a hold, a connect not done at once. It then
// goes on in the goroutine it was called in, which ends with it.
func (s *Server) handle(c int, peer, key netip.AddrPort, inh inherited, i *inline) {
	defer s.admitting.end() // begun by serve (accept.go)
	// The request escapes (Pick is an interface call): on the heap alone,
	// it leaves in on the stack.
	in := &inbound{c: c, key: key, r: new(sched.Request), l: lease{srv: s, c: c}}
	in.start = time.Now()
	if !s.identify(in, peer, inh, i) || !s.takeSlots(in) {
		return
	}
	bc, t, ok := s.reach(in, i)
	if !ok {
		return
	}
	s.startSession(in, t, bc)
}

// identify finds in's service and client: the service at its address (on
// an address routed by name, the one the client's first bytes choose),
// its policy and socket options, and the client's address and the one it
// asked for (a trusted PROXY header's). A PostgreSQL CancelRequest is
// forwarded here (cancel.go), and ends the connection.
func (s *Server) identify(in *inbound, peer netip.AddrPort, inh inherited, i *inline) bool {
	c, key := in.c, in.key
	snap := s.tbl.Load()
	// On an address routed by name, any of its services until the route is
	// chosen: they agree on what comes before (keepalive aside, set again).
	if in.svc = snap.Route(key); in.svc == nil { // the listener is being closed by a reload
		in.drop()
		return false
	}
	in.pol = snap.Policy(in.svc)
	rs := snap.Routes(key) // nil: not routed by name
	if len(in.pol.AcceptProxy) > 0 || in.pol.QueueTimeout > 0 || rs != nil {
		s.detach(i) // a header or a name to wait for, or a queue
	}
	if err := inh.setKeepAlive(c, keepAliveFor(in.pol)); err != nil { // a socket that takes no option is not worth serving
		s.log.Warn().Err(err).Str("service", in.svc.Name).Msg("accepted connection")
		in.drop()
		return false
	}
	if err := setUserTimeoutFD(c, in.pol.UserTimeout); err != nil {
		s.log.Warn().Err(err).Str("service", in.svc.Name).Msg("cannot set user_timeout on the client socket")
	}
	in.r.Client = unmap(peer)
	in.orig = localAddr(c, key) // the address the client asked for
	if why, err := s.proxyHeader(in.pol, c, &in.r.Client, &in.orig); err != nil {
		s.reject(in, why, err)
		return false
	}
	in.addr = in.r.Client
	if in.pol.Postgres && rs == nil && s.cancelled(c, key, in.pol, in.addr, in.start, i) { // a CancelRequest: forwarded (cancel.go)
		in.l.release()
		return false
	}
	in.tm.viewAt = in.start
	return rs == nil || s.routeIn(in, rs, snap)
}

// takeSlots screens in (access lists, accept rate, a refusing split
// brain) and takes its source slot and a service slot, waiting in the
// service's queue if need be.
func (s *Server) takeSlots(in *inbound) bool {
	in.adm = s.adm.get(in.svc.Name)
	if why, err := screen(in.adm, in.pol, in.addr); err != nil {
		s.reject(in, why, err)
		return false
	}
	if refusesSplitBrain(in.svc) { // counted here, logged once per split (by reload), not per connection
		in.adm.rejects.add(RejectSplitBrain)
		in.drop()
		return false
	}
	if !in.l.holdSource(in.adm, in.addr.Addr(), in.pol.MaxConnsPerSource) {
		s.reject(in, RejectPerSource, fmt.Errorf("%d connections from %s already", in.pol.MaxConnsPerSource, in.addr.Addr()))
		return false
	}
	if !in.l.holdService(in.pol, in.start, in.c, &in.tm) {
		if in.tm.waited && clientGone(in.c) {
			s.fail(in, nil, endGone, errClientGone)
			return false
		}
		in.adm.rejects.add(RejectFull)
		s.fail(in, nil, endFull, errFull)
		return false
	}
	return true
}

// reach connects in to a backend (connect; held with hold_timeout:
// connectHeld), whose slot its lease then holds, and sends it the PROXY
// header if it takes one. It returns the backend's socket and target.
func (s *Server) reach(in *inbound, i *inline) (bc int, t *sched.Target, ok bool) {
	ready := toBackend(in.h, in.pol, in.addr, in.orig)
	bc, t, err := s.connect(in, ready, i)
	if err != nil && in.pol.HoldTimeout > 0 && !errors.Is(err, errFull) && !errors.Is(err, errClientGone) {
		s.detach(i)
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
		return -1, nil, false
	}
	in.l.b = t.B                                   // connect took its slot
	if t.ProxyProtocol > 0 && !postgresTLS(in.h) { // such a backend had its header before its SSLRequest
		if err := wire.WriteHeader(fdWriter(bc), t.ProxyProtocol, in.addr, in.orig); err != nil {
			sockfd.Close(bc)
			s.fail(in, t, endReset, fmt.Errorf("send PROXY header: %w", err))
			return -1, nil, false
		}
	}
	return bc, t, true
}

// startSession makes in's session over backend socket bc (target t),
// tracked by its backend, and runs it; the session takes the lease over.
func (s *Server) startSession(in *inbound, t *sched.Target, bc int) {
	ss := newSession(s, in, t, bc)
	seamAt(seamPicked, ss)
	ok, cut := t.B.TrackSince(ss, in.tm.viewAt)
	if !ok { // the backend's drain deadline has passed
		ss.drained.Store(true)
		ss.unref() // admission's count, the only one: finish
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

// routeIn chooses in's service by the name its client sends first, on an
// address routed by name (rs, in snapshot snap). false: the connection was
// refused, counted and closed.
func (s *Server) routeIn(in *inbound, rs *sched.Routes, snap *Snapshot) bool {
	first := in.pol
	if in.svc, in.h = s.route(in.c, in.key, rs, in.addr); in.svc == nil {
		in.l.release() // refused and counted: closed here
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

// drop ends in with no access line: its lease (the client's socket too)
// is given back.
func (in *inbound) drop() {
	in.l.release()
}

// fail ends in for end (t: the backend that took it, nil when none did;
// then it is counted as unserved, before the close) with its access line.
func (s *Server) fail(in *inbound, t *sched.Target, end string, err error) {
	if t == nil {
		in.adm.unservedFor(end)
	}
	in.l.release(func() { s.access(&in.accessInfo, t, 0, 0, end, err) })
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
