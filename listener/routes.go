package listener

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"fulcrum/internal/wire"
	"fulcrum/sched"
)

// Routing by name on a shared listen address: admission calls
// Server.route after the accept (and after a PROXY header), before anything
// else it does for a service, then Server.routed; connect runs the
// function toBackend gives on each backend it connects, before the
// splice. See hello.go for the reading and sched.Routes for the choice.

// ReasonNoRoute: no route takes the client and the address has no default.
const ReasonNoRoute = "no-route"

// errNoRoute is the detail of a ReasonNoRoute refusal.
var errNoRoute = errors.New("no route for the client's server name and protocols, and no default")

// choose reads the first message of the client on fd, within the address's
// preread_timeout (waiting in one of loops, if it must wait), and returns
// the service that takes it with what was read. The error is a
// *wire.Error: the client's message could not be read, or
// (ReasonNoRoute) no route takes it. A PostgreSQL CancelRequest has no
// route: a nil service and a nil error, h.Proto wire.ProtoCancel.
func choose(fd int, rs *sched.Routes, loops loopSource) (*sched.Service, wire.Hello, error) {
	h, err := preread(fd, rs.PrereadTimeout(), loops)
	if err != nil || h.Proto == wire.ProtoCancel {
		return nil, h, err
	}
	svc := rs.Match(h.SNI, h.ALPN)
	if svc == nil {
		return nil, h, &wire.Error{Reason: ReasonNoRoute, Err: errNoRoute}
	}
	return svc, h, nil
}

// toBackend returns what connect must do, for a client that sent h first, to each backend it connects for
// a client whose SSLRequest fulcrum answered: send the PROXY header, if the
// target takes one, then an SSLRequest the backend must accept (else a
// *wire.Error with wire.ReasonNoSSL, which counts as a failed connect). nil
// for every other client: its first bytes are still in its socket.
func toBackend(h *wire.Hello, pol *Policy, client, orig netip.AddrPort) func(int, *sched.Target) error {
	if !postgresTLS(h) {
		return nil
	}
	return func(bc int, t *sched.Target) error {
		if t.ProxyProtocol > 0 {
			if err := wire.WriteHeader(fdWriter(bc), t.ProxyProtocol, client, orig); err != nil {
				return fmt.Errorf("send PROXY header: %w", err)
			}
		}
		return backendSSL(bc, pol.ConnectTimeout)
	}
}

// serviceAt is the service that takes connections on listen address key
// in table t: its own, or on an address routed by name, the service called
// name (the route a connection already took). nil when there is none.
func serviceAt(t *sched.Table, key netip.AddrPort, name string) *sched.Service {
	if t.Routes(key) == nil {
		return t.Route(key)
	}
	if svc := t.Service(name); svc != nil && slices.Contains(svc.Listen, key) {
		return svc
	}
	return nil
}

// reroute is the service of table t that takes, on listen address key, a
// connection that took the route to the service called name in an older
// table: that service, if t still has it there, else the one t's routes
// choose for what the client sent first (h), else t's service for key
// (an address no longer routed by name). nil when t has none.
func reroute(t *sched.Table, key netip.AddrPort, name string, h *wire.Hello) *sched.Service {
	if svc := serviceAt(t, key, name); svc != nil {
		return svc
	}
	if rs := t.Routes(key); rs != nil {
		return rs.Match(h.SNI, h.ALPN)
	}
	return t.Route(key)
}

// postgresTLS reports whether h is a PostgreSQL client whose SSLRequest
// fulcrum answered (false for nil: an address not routed).
func postgresTLS(h *wire.Hello) bool { return h != nil && h.Proto == wire.ProtoPostgres }

// route is admission's routing step on listen address key: it returns the
// service that takes client c and what c sent first. When none does, or
// c's first message cannot be read, it counts the refusal on the listener
// by reason and returns a nil service. A PostgreSQL CancelRequest is
// forwarded (cancel.go) and logged, and a nil service returned too. Either
// way the caller's lease then closes c.
func (s *Server) route(c int, key netip.AddrPort, rs *sched.Routes, client netip.AddrPort) (*sched.Service, *wire.Hello) {
	svc, h, err := choose(c, rs, s)
	if err == nil && svc == nil {
		s.cancel(c, key, client, h.Len, time.Now())
		return nil, nil
	}
	if err == nil {
		return svc, &h
	}
	s.refuse(c, key, client, h.SNI, err)
	return nil, nil
}

// refuse counts a routing refusal on the listener by reason and logs it
// (at most once a second); the caller's lease then closes client socket c. Apart from route, which
// the connection's goroutine runs with little stack to spare.
func (s *Server) refuse(c int, key, client netip.AddrPort, sni string, err error) {
	reason := wire.ReasonMalformed
	var pe *wire.Error
	if errors.As(err, &pe) {
		reason = pe.Reason
	}
	s.mu.Lock()
	so := s.lns[key]
	s.mu.Unlock()
	if so != nil { // nil once a reload has retired the listener
		if total, held, log := so.refused.add(rejectOf(reason)); log {
			s.log.Warn().Stringer("listen", key).Stringer("client", client).Str("sni", sni).Str("reason", reason).
				Err(err).Uint64("refused_so_far", total).Uint64("suppressed", held).Msg("connection refused")
		}
	}
}

// routed gives client socket c the keepalive and user timeout of pol, the
// policy of the service its route chose, where they differ from those of
// first, which the socket was given at the accept.
func routed(c int, first, pol *Policy) {
	if pol == first {
		return
	}
	if k := keepAliveFor(pol); k != keepAliveFor(first) {
		_ = setKeepAliveFD(c, k) // best effort: the socket took first's a moment ago
	}
	if pol.UserTimeout != first.UserTimeout {
		_ = setAcceptedUserTimeout(c, pol.UserTimeout) // likewise (0 too)
	}
}

// helloSNI is the server name h carries; "" for nil (an address not routed).
func helloSNI(h *wire.Hello) string {
	if h == nil {
		return ""
	}
	return h.SNI
}
