// Package listener owns fulcrum's sockets: one accept loop per listen address
// and the per-connection path — pick a backend, dial it, and splice bytes
// both ways with half-close — reading the scheduler snapshot through a Loader.
//
// Typical use (the reload package does this):
//
//	srv := listener.New(&ptr, logger) // ptr is an atomic.Pointer[sched.Table]
//	ch, err := srv.Prepare(addrs)     // bind what is new; nothing accepts yet
//	if err != nil { ... }             // Prepare closed what it had bound
//	ptr.Store(next)
//	ch.Commit()                       // start new accept loops, close removed ones
//	...
//	srv.Close() // stop accepting everywhere
//	srv.Wait()  // accept loops and sessions have ended
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
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/sched"
)

// Loader returns the current snapshot; *atomic.Pointer[sched.Table] is one.
type Loader interface {
	Load() *sched.Table
}

// Server accepts on a set of listen addresses and proxies each connection.
type Server struct {
	tbl Loader
	log zerolog.Logger
	wg  sync.WaitGroup // accept loops and sessions

	mu  sync.Mutex // protects lns
	lns map[netip.AddrPort]*socket

	pipes  pipePool // splice pipes lent to sessions while they move data
	mode   copyMode // how sessions copy; copyAuto but in tests
	parked bool     // every session uses the parked design (parked.go), as if each service said so; tests

	npl  int                     // pollers for parked sessions; 0 = one per two Ps (GOMAXPROCS), at least one
	plMu sync.Mutex              // serialises starting and stopping the pollers
	pls  atomic.Pointer[pollers] // the parked sessions' epolls, started with the first
	next atomic.Uint32           // round robin over pls
}

// pollers are the epolls of a Server's parked sessions: a session stays
// with the one it was given.
type pollers []*poller

// socket is one listening socket and its accept loop.
type socket struct {
	key  netip.AddrPort // the address as configured (port 0 stays 0)
	ln   *net.TCPListener
	done chan struct{} // closed when the socket is closed on purpose
}

// New returns a Server with no listeners.
func New(tbl Loader, log zerolog.Logger) *Server {
	return &Server{tbl: tbl, log: log.With().Str("component", "listener").Logger(), lns: map[netip.AddrPort]*socket{},
		pipes: pipePool{size: pipeSize, max: pipesKept}}
}

// keepAlive is applied to both legs of every connection.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 10 * time.Second, Count: 6}

// Change is a pending change of the listener set, made by Prepare.
type Change struct {
	s      *Server
	want   map[netip.AddrPort]bool
	opened []*socket
}

// Prepare binds every address in want that is not open yet. Nothing is
// accepted until Commit; connections wait in the kernel backlog. On error it
// closes what it bound and leaves the open set as it was.
func (s *Server) Prepare(want []netip.AddrPort) (*Change, error) {
	c := &Change{s: s, want: make(map[netip.AddrPort]bool, len(want))}
	s.mu.Lock()
	defer s.mu.Unlock()
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	for _, a := range want {
		c.want[a] = true
		if _, ok := s.lns[a]; ok {
			continue
		}
		ln, err := lc.Listen(context.Background(), "tcp", a.String())
		if err != nil {
			c.abort()
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		c.opened = append(c.opened, &socket{key: a, ln: ln.(*net.TCPListener), done: make(chan struct{})})
	}
	return c, nil
}

func (c *Change) abort() {
	for _, so := range c.opened {
		so.ln.Close()
	}
	c.opened = nil
}

// Abort closes what Prepare bound.
func (c *Change) Abort() {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.abort()
}

// Commit starts accepting on the new sockets and closes those not wanted.
// Sockets whose address is kept are untouched: not one SYN is lost.
func (c *Change) Commit() (opened, closed []netip.AddrPort) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, so := range c.opened {
		s.lns[so.key] = so
		opened = append(opened, so.key)
		s.log.Info().Stringer("listen", so.key).Stringer("addr", so.ln.Addr()).Msg("listening")
		s.wg.Add(1)
		go s.accept(so) // exits when so.ln is closed
	}
	for a, so := range s.lns {
		if !c.want[a] {
			s.log.Info().Stringer("listen", a).Msg("listener closed")
			so.close()
			delete(s.lns, a)
			closed = append(closed, a)
		}
	}
	return opened, closed
}

func (so *socket) close() {
	close(so.done)
	so.ln.Close()
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

// Close stops accepting on every listener. Open sessions continue.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a, so := range s.lns {
		so.close()
		delete(s.lns, a)
	}
}

// Wait blocks until every accept loop and session has ended, then closes
// the splice pipes kept for reuse.
func (s *Server) Wait() {
	s.wg.Wait()
	s.pipes.closeIdle()
	s.plMu.Lock()
	if pls := s.pls.Swap(nil); pls != nil {
		for _, pl := range *pls {
			pl.close()
		}
	}
	s.plMu.Unlock()
}

// poller returns an epoll for a parked session, round robin over the
// Server's, starting them if need be, or nil if they cannot be started.
func (s *Server) poller() *poller {
	pls := s.pls.Load()
	if pls == nil {
		if pls = s.startPollers(); pls == nil {
			return nil
		}
	}
	return (*pls)[s.next.Add(1)%uint32(len(*pls))]
}

func (s *Server) startPollers() *pollers {
	s.plMu.Lock()
	defer s.plMu.Unlock()
	if pls := s.pls.Load(); pls != nil {
		return pls
	}
	n := s.npl
	if n <= 0 {
		n = max(1, runtime.GOMAXPROCS(0)/2)
	}
	pls := make(pollers, 0, n)
	for range n {
		pl, err := newPoller()
		if err != nil {
			for _, pl := range pls {
				pl.close()
			}
			s.log.Warn().Err(err).Msg("cannot start the epoll of parked sessions; copying in the pooled design")
			return nil
		}
		pls = append(pls, pl)
	}
	s.pls.Store(&pls)
	return &pls
}

// accept runs one accept loop. Temporary failures (EMFILE, ENFILE,
// ECONNABORTED, ENOBUFS…) back off from 5 ms, doubling to 1 s, and never end
// the loop; only closing the socket does.
func (s *Server) accept(so *socket) {
	defer s.wg.Done()
	var delay time.Duration
	var t *time.Timer
	for {
		c, err := so.ln.AcceptTCP()
		if err == nil {
			delay = 0
			s.wg.Add(1)
			go s.handle(c, so.key) // exits when the connection ends
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		s.log.Warn().Err(err).Stringer("listen", so.key).Dur("retry_in", delay).Msg("accept failed")
		if t == nil {
			t = time.NewTimer(delay)
		} else {
			t.Reset(delay)
		}
		select {
		case <-so.done:
			t.Stop()
			return
		case <-t.C:
		}
	}
}
