// Package listener owns fulcrum's sockets: one listening socket per listen
// address, which the event loops accept from, and the per-connection path — pick a backend, dial it, and splice bytes
// both ways with half-close — reading the scheduler snapshot Publish stores.
//
// Typical use (the reload package does this):
//
//	srv := listener.New(&ptr, logger) // ptr is an atomic.Pointer[listener.Snapshot]
//	ch, err := srv.Prepare(addrs, false) // bind what is new; nothing accepts yet
//	if err != nil { ... }             // Prepare closed what it had bound
//	srv.Publish(listener.NewSnapshot(next, policies)) // stores it in ptr and wakes held connections
//	ch.Commit()                       // start accepting on new sockets, close removed ones
//	...
//	srv.Close() // stop accepting everywhere
//	srv.Wait()  // accept goroutines and sessions have ended
//
// Ownership: the Server owns its listeners and every session it accepted;
// Wait returns only when all of them are gone. A listener removed by a reload
// stops accepting, but its sessions run on: they belong to the Server, and
// only their own end, a backend drain or process shutdown closes them.
package listener

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// Server accepts on a set of listen addresses and proxies each connection.
type Server struct {
	// tbl holds the snapshot every new connection reads; Snapshot reads
	// it for others, and only Publish stores into it.
	tbl atomic.Pointer[Snapshot]
	log zerolog.Logger
	wg  sync.WaitGroup // accept goroutines and sessions

	beat atomic.Int64 // nanoseconds: accept goroutines wake at least this often; 0 = never

	// acceptHook, if set before the first Prepare, runs at the top of every
	// accept, in a loop or an accept goroutine: a test freezes one with it.
	acceptHook func()

	mu      sync.Mutex // protects lns, spare and adopted
	lns     map[netip.AddrPort]*socket
	spare   map[netip.AddrPort]*lsock // inherited from systemd or adopted (export.go), not in use
	adopted map[netip.AddrPort]bool   // spares handed over by the process this one replaced: ours to close

	slots     chan struct{} // the global connection limit: one entry per connection accepted and not ended (limit.go)
	atLimit   atomic.Uint64 // times an accept goroutine waited for a slot
	limited   atomic.Bool   // an accept goroutine is waiting for a slot: an episode at the limit
	limitLog  every         // lets an episode's line through at most once a second (limit.go)
	limitTold atomic.Bool   // the current episode's start was logged: so is its end

	admitting admitCount // connections accepted and not yet sessions or ended (Admitted)
	adm       admissions // each service's admission state, by name (admission.go)

	cancels atomic.Int32 // PostgreSQL cancel requests being forwarded, at most maxCancels (cancel.go)

	pipes pipePool // splice pipes lent to sessions while they move data
	// lateKA gives sessions' backend sockets their keepalive once they have
	// lived keepAliveAfter (keepalive.go).
	lateKA lateKeepAlive
	mode   copyMode // how sessions copy; copyAuto but in tests

	nlp  int                   // event loops; 0 = one per P (GOMAXPROCS)
	lpMu sync.Mutex            // serialises starting and stopping the loops
	lps  atomic.Pointer[loops] // the event loops, started with the first listening socket (newSocket)
	next atomic.Uint32         // round robin over lps
}

// loops are a Server's event loops: a session stays in the one it was given.
type loops []*loop

// socket is one listening socket and its accept path.
type socket struct {
	key       netip.AddrPort // the address as configured (port 0 stays 0)
	ln        *lsock
	inherited bool          // passed by systemd: never closed by a reload, only handed back
	done      chan struct{} // closed when the socket is taken out of service
	exited    chan struct{} // closed when its accept goroutine has ended it (endSocket)
	// a is its accept path, on ln's descriptor, which only the event loops
	// watch (accept.go). Made by Prepare, so that a socket the loops cannot
	// watch refuses the reload instead of leaving a listener that never
	// accepts.
	a       *acceptor
	beat    atomic.Int64 // unix nanoseconds of the loop's last answer
	accepts atomic.Uint64
	errors  atomic.Uint64
	refused rejects // connections routing by name turned away (routes.go)
}

// New returns a Server with no listeners and no snapshot: it serves the
// snapshots Publish gives it.
func New(log zerolog.Logger) *Server {
	return &Server{log: log.With().Str("component", "listener").Logger(),
		lns: map[netip.AddrPort]*socket{}, spare: map[netip.AddrPort]*lsock{},
		slots: make(chan struct{}, connLimit(nofile())),
		pipes: newPipePool(pipeLimit(nofile()))}
}

// Publish makes snap the snapshot every new connection reads, then wakes
// the connections held for an eligible backend (hold_timeout) to look at
// it. It is the one way a snapshot is published, so that no publisher can
// forget the wake: a held connection is otherwise woken only by a passing
// check (Kick), and one whose backend came back by a reload would wait
// until its hold_timeout.
//
// It gives each service of snap its admission state, kept by name from
// one snapshot to the next (the first snapshot naming a service adds it),
// and its policy's accept_rate, before the store.
func (s *Server) Publish(snap *Snapshot) {
	for _, svc := range snap.Services {
		pol := snap.Policy(svc)
		s.adm.get(svc.Name).setRate(pol.AcceptRate, pol.AcceptBurst)
	}
	s.tbl.Store(snap)
	for _, svc := range snap.Services {
		s.adm.get(svc.Name).kick()
	}
}

// Snapshot returns the snapshot new connections read (the last Publish);
// nil before the first. It is read-only: Publish is the one writer.
func (s *Server) Snapshot() *Snapshot { return s.tbl.Load() }

// Inherit offers a listening socket passed by the service manager. Prepare
// adopts it for the configured address it is bound to instead of binding
// that address; until then, and after a reload removes its address, it is
// kept open (systemd holds the address) and Close closes it at the end.
// It takes ln over (takeListener): the caller no longer uses or closes it.
func (s *Server) Inherit(ln *net.TCPListener) (netip.AddrPort, error) {
	l, err := takeListener(ln)
	if err != nil {
		return netip.AddrPort{}, err
	}
	a := l.addr.AddrPort()
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	s.mu.Lock()
	s.spare[a] = l
	s.mu.Unlock()
	return a, nil
}

// lsock is a listening socket the Server holds, as a raw descriptor in no
// poller of Go's: only the event loops watch it (accept.go), so no thread
// but a loop's wakes for a connection. A *net.TCPListener would be in
// Go's poller, whose idle thread would wake for every connection, to find
// no goroutine waiting.
type lsock struct {
	fd   int // non-blocking, as Go made it
	addr *net.TCPAddr
}

// takeListener takes ln's socket as an lsock: a duplicate of its
// descriptor, then ln closed, which takes it out of Go's poller and leaves
// the socket open and listening on the duplicate.
func takeListener(ln *net.TCPListener) (*lsock, error) {
	fd, err := dupListener(ln)
	if err != nil {
		return nil, err
	}
	l := &lsock{fd: fd, addr: ln.Addr().(*net.TCPAddr)}
	ln.Close()
	return l, nil
}

func (l *lsock) Addr() net.Addr { return l.addr }
func (l *lsock) Close()         { sockfd.Close(l.fd) }

// SetHeartbeat makes every accept goroutine wake and accept at least every d, so
// that Alive can tell a live loop from a stuck one; 0 turns it off.
func (s *Server) SetHeartbeat(d time.Duration) {
	s.beat.Store(int64(d))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, so := range s.lns { // accept goroutines already waiting wait at most d from now
		select {
		case so.a.poke <- struct{}{}:
		default: // poked already
		}
	}
}

// Alive reports whether every accept path has answered within maxAge: the
// watchdog's liveness probe.
func (s *Server) Alive(maxAge time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	oldest := time.Now().Add(-maxAge).UnixNano()
	for _, so := range s.lns {
		if so.beat.Load() < oldest {
			return false
		}
	}
	return true
}

// setNoDelay sets TCP_NODELAY and SO_OOBINLINE on a listening socket,
// which every socket it accepts inherits (Linux copies both to each): no
// setsockopt per accept. SO_OOBINLINE keeps a client's urgent byte
// (MSG_OOB) in the stream, to be forwarded as an ordinary byte (xfer.go).
// A Multipath TCP socket (what Go's Listen makes by default) takes no
// SO_OOBINLINE (EOPNOTSUPP): its connections keep the kernel's way, in
// which an urgent byte is not part of the stream and is not forwarded, as
// HAProxy and nginx do; the copy path steps over the mark either way.
func setNoDelay(c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = setNoDelayFD(int(fd)) }); err != nil {
		return err
	}
	return serr
}

// setNoDelayFD is setNoDelay on a raw descriptor.
func setNoDelayFD(fd int) error {
	if err := sockfd.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("set TCP_NODELAY: %w", err)
	}
	if err := sockfd.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("set SO_OOBINLINE: %w", err)
	}
	return nil
}

// setFreebind sets IP_FREEBIND (IPV6_FREEBIND for IPv6) on a socket before bind.
func setFreebind(network, _ string, c syscall.RawConn) error {
	level, opt := unix.IPPROTO_IP, unix.IP_FREEBIND
	if network == "tcp6" {
		level, opt = unix.IPPROTO_IPV6, unix.IPV6_FREEBIND
	}
	var serr error
	if err := c.Control(func(fd uintptr) { serr = sockfd.SetsockoptInt(int(fd), level, opt, 1) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set freebind: %w", serr)
	}
	return nil
}

// SocketStats are one listener's counters.
type SocketStats struct {
	Listen       netip.AddrPort // as configured
	Addr         string         // as bound
	Accepts      uint64
	AcceptErrors uint64
	Inherited    bool
	Refused      map[string]uint64 // routing by name: connections turned away, by reason; nil if none
}

// Sockets returns the counters of every open listener.
func (s *Server) Sockets() []SocketStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SocketStats, 0, len(s.lns))
	for _, so := range s.lns {
		out = append(out, SocketStats{Listen: so.key, Addr: so.ln.Addr().String(), Accepts: so.accepts.Load(),
			AcceptErrors: so.errors.Load(), Inherited: so.inherited, Refused: so.refused.counts(routeRejects, false)})
	}
	return out
}

// Change is a pending change of the listener set, made by Prepare.
type Change struct {
	s      *Server
	want   map[netip.AddrPort]bool
	opened []*socket
}

// Prepare binds every address in want that is not open yet, adopting an
// inherited socket bound to that address where there is one. With freebind
// it binds addresses this host does not hold yet (IP_FREEBIND): a keepalived
// backup then listens on the virtual address before the address moves to
// it; sockets already bound are unaffected. Nothing is accepted until
// Commit; connections wait in the kernel backlog. On error it closes what it
// bound and leaves the open set as it was.
func (s *Server) Prepare(want []netip.AddrPort, freebind bool) (*Change, error) {
	c := &Change{s: s, want: make(map[netip.AddrPort]bool, len(want))}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Go is told to set no keepalive per accept: each accepted socket gets
	// its service's own, with its idle time spread (keepalive.go).
	// TCP_NODELAY is inherited from the listening socket.
	lc := net.ListenConfig{KeepAlive: -1, Control: func(network, address string, c syscall.RawConn) error {
		if freebind {
			if err := setFreebind(network, address, c); err != nil {
				return err
			}
		}
		return setNoDelay(c)
	}}
	for _, a := range want {
		if c.want[a] {
			continue // listed twice: services that share it, routed by name
		}
		c.want[a] = true
		if _, ok := s.lns[a]; ok {
			continue
		}
		if ln, ok := s.spare[a]; ok {
			so, err := s.newSocket(a, ln, !s.adopted[a])
			if err != nil {
				c.abort()
				return nil, fmt.Errorf("listen %s: %w", a, err)
			}
			c.opened = append(c.opened, so)
			continue
		}
		l, err := lc.Listen(context.Background(), "tcp", a.String())
		if err != nil {
			c.abort()
			if held, ok := s.overlapping(a); ok && errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("listen %s: %w: this instance's own listener %s holds the port; a reload cannot move a port "+
					"between one address and the wildcard (closing first would reset the connections in its backlog and refuse "+
					"handshakes until the new one binds): that move takes a restart", a, err, held)
			}
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		ln, err := takeListener(l.(*net.TCPListener))
		if err != nil {
			l.Close()
			c.abort()
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		so, err := s.newSocket(a, ln, false)
		if err != nil {
			ln.Close()
			c.abort()
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		c.opened = append(c.opened, so)
	}
	return c, nil
}

// overlapping returns a listener of this Server that holds a's port on an
// address that overlaps a's (one of them the wildcard of the same family,
// or the unspecified address of either), so that binding a fails with
// EADDRINUSE; s.mu is held.
func (s *Server) overlapping(a netip.AddrPort) (netip.AddrPort, bool) {
	for h := range s.lns {
		if h.Port() == a.Port() && h.Addr() != a.Addr() && (h.Addr().IsUnspecified() || a.Addr().IsUnspecified()) {
			return h, true
		}
	}
	return netip.AddrPort{}, false
}

// newSocket prepares ln's accept path: its duplicate, watched by every
// event loop (started here if need be). Nothing accepts from it until its
// accept goroutine starts (Commit): until then a loop that sees a
// connection only marks it kicked.
func (s *Server) newSocket(a netip.AddrPort, ln *lsock, inherited bool) (*socket, error) {
	lps := s.lps.Load()
	if lps == nil {
		var err error
		if lps, err = s.startLoops(); err != nil {
			return nil, err
		}
	}
	// TCP_NODELAY and SO_OOBINLINE, which accepted sockets inherit, again:
	// an inherited socket may lack them.
	if err := setNoDelayFD(ln.fd); err != nil {
		return nil, err
	}
	so := &socket{key: a, ln: ln, inherited: inherited, done: make(chan struct{}), exited: make(chan struct{})}
	so.a = &acceptor{s: s, so: so, fd: ln.fd, own: make(chan struct{}, 1), poke: make(chan struct{}, 1)}
	so.a.state.Store(stRunning) // its accept goroutine's, from its start
	for _, lp := range *lps {
		if err := lp.watch(so.a); err != nil {
			so.unwatch(lps)
			return nil, fmt.Errorf("watch in event loop: %w", err)
		}
	}
	so.beat.Store(time.Now().UnixNano())
	return so, nil
}

// unwatch takes so out of every loop of lps: a socket that never accepted.
func (so *socket) unwatch(lps *loops) {
	for _, lp := range *lps {
		lp.unwatch(so.a)
	}
}

func (c *Change) abort() {
	lps := c.s.lps.Load() // not nil: every socket opened is watched by its loops
	for _, so := range c.opened {
		so.unwatch(lps)
		if !so.inherited && c.s.spare[so.key] != so.ln { // an adopted spare stays a spare
			so.ln.Close()
		}
	}
	c.opened = nil
}

// Commit starts accepting on the new sockets and takes out of service those
// not wanted. Sockets whose address is kept are untouched: not one SYN is
// lost. A snapshot must be published by then: the accept paths
// read it before their first accept (keepalive.go).
func (c *Change) Commit() (opened, closed []netip.AddrPort) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, so := range c.opened {
		delete(s.spare, so.key)
		delete(s.adopted, so.key)
		s.lns[so.key] = so
		opened = append(opened, so.key)
		s.log.Info().Stringer("listen", so.key).Stringer("addr", so.ln.Addr()).Bool("inherited", so.inherited).Msg("listening")
		s.wg.Add(1)
		go s.accept(so.a, true) // exits when so is closed or taken out of service
	}
	for a, so := range s.lns {
		if !c.want[a] {
			s.log.Info().Stringer("listen", a).Msg("listener closed")
			s.retire(so)
			closed = append(closed, a)
		}
	}
	return opened, closed
}

// retire stops a socket's accept path. An inherited socket stays open, back
// among the spares; any other is closed. Called with s.mu held.
func (s *Server) retire(so *socket) {
	delete(s.lns, so.key)
	close(so.done) // wakes its accept goroutine, which closes its duplicate as it ends
	// The accept path's duplicate of the socket keeps it listening until
	// then: wait for that, so that a socket retired is closed.
	<-so.exited
	if !so.inherited {
		so.ln.Close()
		return
	}
	s.spare[so.key] = so.ln
}

// Addr returns the bound address of the listener configured as a (which
// differs from a when a's port is 0), or nil.
func (s *Server) Addr(a netip.AddrPort) net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if so, ok := s.lns[a]; ok {
		return so.ln.Addr()
	}
	return nil
}

// Close stops accepting on every listener and closes them, inherited ones
// included. Open sessions continue.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, so := range s.lns {
		s.retire(so)
	}
	for a, ln := range s.spare {
		ln.Close()
		delete(s.spare, a)
	}
}

// Wait blocks until every accept goroutine and session has ended, then closes
// the splice pipes kept for reuse and stops the event loops.
func (s *Server) Wait() {
	s.wg.Wait()
	s.lateKA.stop()
	s.pipes.closeIdle()
	s.lpMu.Lock()
	if lps := s.lps.Swap(nil); lps != nil {
		for _, lp := range *lps {
			lp.close()
		}
	}
	s.lpMu.Unlock()
}

// loop returns an event loop for a session or a dial, round robin over the
// Server's, starting them if need be.
func (s *Server) loop() (*loop, error) {
	lps := s.lps.Load()
	if lps == nil {
		var err error
		if lps, err = s.startLoops(); err != nil {
			return nil, err
		}
	}
	return (*lps)[s.next.Add(1)%uint32(len(*lps))], nil
}

func (s *Server) startLoops() (*loops, error) {
	s.lpMu.Lock()
	defer s.lpMu.Unlock()
	if lps := s.lps.Load(); lps != nil {
		return lps, nil
	}
	n := s.nlp
	if n <= 0 {
		n = loopProcs() // fulcrum sets one P per usable CPU, or [process] loops (procs.go)
	}
	reserveP(n)
	lps := make(loops, 0, n)
	for range n {
		lp, err := newLoop()
		if err != nil {
			for _, lp := range lps {
				lp.close()
			}
			s.log.Error().Err(err).Msg("cannot start an event loop")
			return nil, fmt.Errorf("start event loop: %w", err)
		}
		lps = append(lps, lp)
	}
	s.lps.Store(&lps)
	return &lps, nil
}
