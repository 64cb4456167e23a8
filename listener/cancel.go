package listener

// PostgreSQL cancel requests. A client cancels a running query by opening
// a new connection and sending a CancelRequest on it (length, the code
// 80877102, the backend's process ID and secret key; keys of protocol 3.2
// are up to 256 bytes): scheduled like any connection, it would mostly
// reach a server that has no such process, and the query would run on.
// fulcrum recognises the packet before scheduling and sends it to the
// backends that hold a session of the same client address (the PROXY
// address when trusted) in any service of the listen address; only when
// none does, to every backend of those services. Each gets the packet on a
// connection of its own, which is closed once the backend closes it (it
// answers nothing); the client's connection is then closed, as PostgreSQL
// closes it. A cancel is no session: it takes no service, source or
// backend slot, counts no failure, and ends with one access line (end
// "cancel", the backends it went to).
//
// Where a CancelRequest is looked for (docs/databases.md):
//   - on an address routed by name, always: preread reads every client's
//     first bytes there anyway (hello.go), and a cancel comes without TLS;
//   - on any other address, only when its service speaks PostgreSQL
//     (Policy.Postgres: a backend checks with pgsql), since telling waits
//     for the client's first bytes, which a server-first protocol (MySQL)
//     never sends.
//
// Hooks in the connection path: admission (admit.go) calls
// Server.cancelled after the PROXY header on a plain address; route
// (routes.go) calls Server.cancel when preread found a cancel.

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sys/unix"

	"fulcrum/backend"
	"fulcrum/internal/sockfd"
	"fulcrum/internal/wire"
	"fulcrum/sched"
)

const (
	// cancelTimeout bounds each backend's part of a cancel: the dial (or
	// the service's connect_timeout, if shorter), the write, and the wait
	// for the backend to close.
	cancelTimeout = 5 * time.Second
	endCancel     = "cancel"
)

// cancelled is admission's hook on a plain address whose service speaks
// PostgreSQL: it reports whether client c sent a CancelRequest, which it
// has then forwarded and logged (the caller gives back the lease, which
// closes c).
// Otherwise nothing is consumed. It waits for the first bytes (within
// pol.PrereadTimeout) only when they have not come yet, handing the accept
// loop on (i) first.
func (s *Server) cancelled(c int, key netip.AddrPort, pol *Policy, client netip.AddrPort, start time.Time, i *inline) bool {
	n := peekCancel(c, pol.PrereadTimeout, s, func() { s.detach(i) })
	if n == 0 {
		return false
	}
	s.detach(i) // forwarding dials and waits on every backend named: never in an event loop
	s.cancel(c, key, client, n, start)
	return true
}

// peekCancel returns the length of the CancelRequest client socket fd
// starts with (peeked, not consumed), or 0 when it starts with anything
// else, sends nothing within timeout, or closes. Before it waits, it calls
// wait.
//
// What fd holds already is looked at first, and wait is called here, not
// stored in the fdPeeker: a hook held there would move the caller's inline
// (and every connection's) to the heap, since the peeker's descriptor
// escapes to Go's poller.
func peekCancel(fd int, timeout time.Duration, loops loopSource, wait func()) int {
	var buf [wire.MaxCancel]byte
	seen := 0
	switch n, err := sockfd.RecvPeek(fd, buf[:]); {
	case err == nil && n == 0:
		return 0 // closed: the session sees it
	case err == nil:
		l, ok := wire.CancelLen(buf[:n])
		if !ok {
			return 0
		}
		if l > 0 && n >= l {
			return l
		}
		seen = n
	case err != unix.EAGAIN && err != unix.EINTR:
		return 0
	}
	wait()
	if timeout <= 0 {
		timeout = DefaultPrereadTimeout
	}
	p := fdPeeker{fd: fd, loops: loops, timeout: timeout}
	defer p.close()
	for {
		n, err := p.peek(buf[:], seen)
		if err != nil {
			return 0 // nothing within timeout (a server-first protocol), or closed
		}
		l, ok := wire.CancelLen(buf[:n])
		if !ok {
			return 0
		}
		if l > 0 && n >= l {
			return l
		}
		seen = n
	}
}

// cancelTarget is a backend a cancel goes to, with its service's policy.
type cancelTarget struct {
	svc *sched.Service
	pol *Policy
	t   sched.Target
}

// maxCancels bounds the cancel requests a Server forwards at once. A
// cancel is 16 unauthenticated bytes that become one connection per backend
// when no backend holds a session of its client, each waiting up to
// cancelTimeout for the backend's close: without a bound, a flood of them
// is a flood of connections to the databases. A legitimate client sends
// one per query it gives up on; one over the bound is refused (closed,
// with its access line), as PostgreSQL answers a cancel with nothing
// anyway.
const maxCancels = 64

// errCancels: maxCancels cancel requests are being forwarded already.
var errCancels = fmt.Errorf("%d cancel requests are being forwarded already", maxCancels)

// cancel consumes the CancelRequest of n bytes client socket c holds
// (peeked already), sends it to the backends of listen address key that
// should have it (cancelTargets) and writes the access line; the caller's
// lease then closes c.
// It is screened first, as any connection is (access lists, accept_rate:
// screen), against each service of the address, and goes only to those
// that admit it; it takes no per-source slot, so that a client at its
// max_conns_per_source can still cancel its own query. At most maxCancels
// are forwarded at once.
func (s *Server) cancel(c int, key, client netip.AddrPort, n int, start time.Time) {
	// Consumed first, whatever comes of it, so that the close is a FIN:
	// unread bytes would make it a reset.
	var buf [wire.MaxCancel]byte
	pkt := buf[:n]
	err := readAll(c, pkt)
	if err == nil {
		var req pgproto3.CancelRequest
		err = req.Decode(pkt[4:])
	}
	snap := s.tbl.Load()
	services := servicesAt(snap, key)
	if len(services) == 0 { // the listener is being closed by a reload
		return
	}
	admitted := make([]*sched.Service, 0, len(services))
	why, werr := Reject(0), error(nil)
	for _, svc := range services {
		if r, err := screen(s.adm.get(svc.Name), snap.Policy(svc), client); err != nil {
			if werr == nil {
				why, werr = r, err
			}
			continue
		}
		admitted = append(admitted, svc)
	}
	if len(admitted) == 0 { // counted and logged as admission counts a refusal
		if total, suppressed, log := s.adm.get(services[0].Name).rejects.add(why); log {
			s.log.Warn().Str("service", services[0].Name).Stringer("client", client).Err(werr).
				Stringer("reason", why).Uint64("rejected_so_far", total).Uint64("suppressed", suppressed).Msg("cancel request rejected")
		}
		return
	}
	svc0, pol0 := admitted[0], snap.Policy(admitted[0])
	if s.cancels.Add(1) > maxCancels {
		s.cancels.Add(-1)
		s.cancelLine(svc0, pol0, client, nil, nil, false, start, errCancels)
		return
	}
	defer s.cancels.Add(-1)
	var ts []cancelTarget
	holding := false
	if err == nil {
		ts, holding = cancelTargets(snap, admitted, client.Addr())
		if len(ts) == 0 {
			err = errors.New("no backend for the client's cancel request")
		}
	}
	errs := make([]error, len(ts))
	if len(ts) > 0 {
		orig := localAddr(c, key)
		var wg sync.WaitGroup
		for i := range ts {
			wg.Add(1)
			go func() { // exits when the backend has closed, or at cancelTimeout
				defer wg.Done()
				errs[i] = s.cancelOne(&ts[i], pkt, client, orig)
			}()
		}
		wg.Wait()
	}
	s.cancelLine(svc0, pol0, client, ts, errs, holding, start, err)
}

// servicesAt returns the services that take connections on listen address
// key: its one, or on an address routed by name, every service routed
// there.
func servicesAt(snap *Snapshot, key netip.AddrPort) []*sched.Service {
	if snap.Routes(key) == nil {
		if svc := snap.Route(key); svc != nil {
			return []*sched.Service{svc}
		}
		return nil
	}
	var out []*sched.Service
	for _, svc := range snap.Services {
		if slices.Contains(svc.Listen, key) {
			out = append(out, svc)
		}
	}
	return out
}

// cancelTargets returns where a cancel from client address a goes among
// services (those that admitted it: screen): the backends, their
// fallbacks' included, that hold a session of a (holding true); if none
// does, every backend of services.
func cancelTargets(snap *Snapshot, services []*sched.Service, a netip.Addr) ([]cancelTarget, bool) {
	match := func(c io.Closer) bool {
		ss, ok := c.(*session)
		return ok && ss.addr.Addr() == a
	}
	var held, all []cancelTarget
	seenHeld, seenAll := map[*backend.Backend]bool{}, map[*backend.Backend]bool{}
	for _, svc := range services {
		pol := snap.Policy(svc)
		for _, from := range []*sched.Service{svc, svc.Fallback} {
			if from == nil {
				continue
			}
			for _, t := range from.All() {
				if !seenHeld[t.B] && t.B.Holds(match) {
					seenHeld[t.B] = true
					held = append(held, cancelTarget{from, pol, t})
				}
				if from == svc && !seenAll[t.B] {
					seenAll[t.B] = true
					all = append(all, cancelTarget{svc, pol, t})
				}
			}
		}
	}
	if len(held) > 0 {
		return held, true
	}
	return all, false
}

// cancelOne sends CancelRequest pkt to ct's backend on a connection of its
// own, dialled as a session's is (Server.dial: its socket options, the
// connect awaited in an event loop, from the client's address with source
// = "client"), within cancelTimeout, after the PROXY header if the backend
// takes one, and waits for the backend to close it: PostgreSQL acts on the
// request, answers nothing and closes (libpq's PQcancel waits for that
// close too).
func (s *Server) cancelOne(ct *cancelTarget, pkt []byte, client, orig netip.AddrPort) error {
	pol := *ct.pol
	if pol.ConnectTimeout <= 0 || pol.ConnectTimeout > cancelTimeout {
		pol.ConnectTimeout = cancelTimeout
	}
	deadline := time.Now().Add(cancelTimeout)
	fd, err := s.dial(&pol, ct.t.Addr, client.Addr(), nil)
	if err != nil {
		return fmt.Errorf("dial backend %s: %w", ct.t.Addr, err)
	}
	c, err := pollable(fd) // for its deadlines; fd's own descriptor is not needed any more
	sockfd.Close(fd)
	if err != nil {
		return fmt.Errorf("dial backend %s: %w", ct.t.Addr, err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if ct.t.ProxyProtocol > 0 {
		if err := wire.WriteHeader(c, ct.t.ProxyProtocol, client, orig); err != nil {
			return fmt.Errorf("send PROXY header to %s: %w", ct.t.Addr, err)
		}
	}
	if _, err := c.Write(pkt); err != nil {
		return fmt.Errorf("send cancel request to %s: %w", ct.t.Addr, err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		return fmt.Errorf("await close of %s: %w", ct.t.Addr, err)
	}
	return nil
}

// readAll reads len(b) bytes from non-blocking socket fd, which holds them
// (peeked): it never waits.
func readAll(fd int, b []byte) error {
	for got := 0; got < len(b); {
		n, err := sockfd.Read(fd, b[got:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		got += n
	}
	return nil
}

// cancelLine writes a cancel's access line: end "cancel", the backends it
// went to ("service/backend" for one of another service than svc's, a
// fallback's or another route's), those it failed to reach, and whether
// they were those holding a session of the client.
func (s *Server) cancelLine(svc *sched.Service, pol *Policy, client netip.AddrPort, ts []cancelTarget, errs []error, holding bool, start time.Time, err error) {
	e := s.log.Debug()
	if pol.AccessLog {
		e = s.log.Info()
	}
	if e == nil {
		return
	}
	var sent, failed []string
	for i, ct := range ts {
		name := ct.t.B.Name
		if ct.svc != svc {
			name = ct.svc.Name + "/" + name
		}
		if errs[i] != nil {
			failed = append(failed, name)
			err = errors.Join(err, errs[i])
			continue
		}
		sent = append(sent, name)
	}
	e = e.Str("service", svc.Name).Stringer("client", client).Strs("backends", sent)
	if len(failed) > 0 {
		e = e.Strs("failed", failed)
	}
	e = e.Bool("holding", holding).Float64("duration_ms", ms(time.Since(start))).Str("end", endCancel)
	if err != nil {
		e = e.AnErr("error", err)
	}
	e.Msg("connection")
}
