package listener

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// TCP keepalive, per service and per socket. The idle time is spread ±20%
// at random: connections opened in a burst (a pool at start-up or after a
// failover) would otherwise probe in step, and on a busy host the
// synchronised probes and their retries overflow the backlog until the
// kernel resets healthy connections. The setter takes a raw descriptor, so
// that any accept or dial path can call it.
//
// A backend socket gets its options one by one (four setsockopts with
// keepalive on), late: below. A client socket inherits them: Linux
// copies a listening socket's SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL and
// TCP_KEEPCNT to each socket it accepts, as they are when the connection
// is queued (TestKeepAliveInherited; the MPTCP listening socket Go makes
// passes them to the TCP socket of a client without MPTCP as well,
// TestKeepAlivePerSocket). So the accept path gives the listening socket
// its service's keepalive (inheritance), and a client socket that carries
// it takes no setsockopt, where it took four of the 26 syscalls of a
// proxied connection. TCP_USER_TIMEOUT is inherited by a TCP listening
// socket's but an MPTCP one refuses it: it stays per socket (off by
// default, so no syscall).
//
// A backend socket gets its keepalive late: lateKeepAlive sets it once the
// session has lived keepAliveAfter, not before the connect. Keepalive only
// acts after a minute (at least a second) of silence, and most connections
// a proxy carries end long before that (a pgbench -C or redis-benchmark
// -k 0 connection in well under a millisecond): set at the connect, the
// four calls were 4 of the 26 syscalls of a proxied connection and about
// 4 µs of the proxy's CPU (bench/README.md, "A backend socket's keepalive,
// set late"), for a probe that could never come. A session that lives
// longer gets the same four calls a quarter of a second in, and its first
// probe comes that much later at worst.
//
// The spread of the client sockets' idle times is drawn on the listening
// socket, again every spreadEvery connections accepted, rather than per
// socket. What the spread is for is a burst of thousands of connections,
// and their idle times come in whole seconds: at the default one minute,
// 25 values from 48 to 72 s. A burst of 8,000 connections (the size that
// lost a third of its connections to synchronised probes) draws 500 times
// over those 25 values, so it probes as evenly spread as with a draw per
// socket; a burst of fewer than spreadEvery connections probes in step,
// which at that size no backlog notices. The backend sockets keep a draw
// each, since their option is set anyway.

// keepAlive is one service's keepalive; a zero Idle turns it off.
type keepAlive struct {
	Idle     time.Duration // before the first probe, before the spread
	Interval time.Duration // between probes
	Count    int           // unanswered probes before the connection is reset
}

// keepAliveFor returns pol's keepalive settings.
func keepAliveFor(pol *Policy) keepAlive {
	return keepAlive{Idle: pol.KeepAliveIdle, Interval: pol.KeepAliveInterval, Count: pol.KeepAliveCount}
}

// jitteredIdle returns idle spread uniformly over ±20%, in whole seconds
// (the socket option's unit), at least one.
func jitteredIdle(idle time.Duration) int {
	d := float64(idle) * (0.8 + 0.4*rand.Float64())
	return max(1, int(d/float64(time.Second)+0.5))
}

// setKeepAliveFD applies ka to the TCP socket fd: SO_KEEPALIVE and, when on,
// the idle time (spread), interval and count. Off clears SO_KEEPALIVE, which
// a socket may have from elsewhere (Go sets it on sockets accepted from a
// listener systemd passed).
func setKeepAliveFD(fd int, ka keepAlive) error {
	if ka.Idle <= 0 {
		if err := sockfd.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0); err != nil {
			return fmt.Errorf("clear keepalive: %w", err)
		}
		return nil
	}
	for _, o := range [...]struct{ level, opt, v int }{
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, jitteredIdle(ka.Idle)},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, max(1, int(ka.Interval/time.Second))},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, max(1, ka.Count)},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	} {
		if err := sockfd.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fmt.Errorf("set keepalive: %w", err)
		}
	}
	return nil
}

// spreadEvery is how many connections a listening socket accepts between
// two draws of its keepalive idle time.
const spreadEvery = 16

// inheritance is what an accept path knows of the keepalive its listening
// socket passes on; only the socket's owner uses it (accept.go).
type inheritance struct {
	set   keepAlive // what the listening socket has, if known
	known bool
	// fresh: the accept queue has been seen empty since set was last
	// changed, so every socket accepted from now on was queued after it and
	// carries it. A socket queued before a change carries the old options.
	fresh   bool
	accepts int // since the idle time was last drawn
}

// prepare gives the listening socket (c) keepalive want, if it has
// another, and draws its idle time again every spreadEvery accepts. It is
// called before each accept. On failure what the socket has is unknown,
// and the sockets accepted get their keepalive one by one.
func (in *inheritance) prepare(fd int, want keepAlive) {
	same := in.known && in.set == want
	if same && (want.Idle <= 0 || in.accepts < spreadEvery) {
		return
	}
	var err error
	if same { // the spread is due, nothing else
		err = sockfd.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, jitteredIdle(want.Idle))
	} else {
		err = setKeepAliveFD(fd, want)
	}
	if err != nil {
		in.known = false
		return
	}
	if !same {
		in.set, in.known, in.fresh = want, true, false
	}
	in.accepts = 0
}

// empty says an accept after prepare found the queue empty: every socket
// accepted from now on was queued after the listening socket took set.
func (in *inheritance) empty() {
	if in.known {
		in.fresh = true
	}
}

// accepted counts a socket accepted after prepare and returns what it
// inherited.
func (in *inheritance) accepted() inherited {
	in.accepts++
	return inherited{ka: in.set, ok: in.known && in.fresh}
}

// inherited is the keepalive a socket accepted carries from its listening
// socket, as far as its accept path knows.
type inherited struct {
	ka keepAlive
	ok bool // the socket carries ka; if false, what it carries is unknown
}

// setKeepAlive gives the accepted socket fd keepalive ka unless it
// inherited it.
func (in inherited) setKeepAlive(fd int, ka keepAlive) error {
	if in.ok && in.ka == ka {
		return nil
	}
	return setKeepAliveFD(fd, ka)
}

// setAcceptedUserTimeout sets TCP_USER_TIMEOUT on an accepted socket fd to
// d, 0 (the kernel's default) included, which setUserTimeoutFD leaves
// alone: routing by name sets it again when the route's differs.
func setAcceptedUserTimeout(fd int, d time.Duration) error {
	return sockfd.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, max(0, int(d/time.Millisecond)))
}

// inherit has the accept path of listen address key give its listening
// socket (fd) the options of the service that takes the address now.
func (s *Server) inherit(in *inheritance, fd int, key netip.AddrPort) {
	snap := s.tbl.Load()
	if svc := snap.Route(key); svc != nil { // nil while a reload closes the address
		in.prepare(fd, keepAliveFor(snap.Policy(svc)))
	}
}

// keepAliveAfter is how long a session's backend socket goes without its
// keepalive (lateKeepAlive).
const keepAliveAfter = 250 * time.Millisecond

// lateKeepAlive gives the backend sockets of sessions that have lived
// keepAliveAfter their service's keepalive, from a timer: a session that
// ends before then never takes the four setsockopts. Sessions are queued in
// the order they begin, so the queue is in order of due time; the timer
// runs while it is not empty, at most every after/4, each run taking every
// session then due.
type lateKeepAlive struct {
	mu    sync.Mutex
	q     []lateEntry // in order of due
	armed bool        // a run is due or running: add leaves the timer alone
	timer *time.Timer
	after time.Duration // keepAliveAfter; tests set their own before the first session

	set atomic.Uint64 // backend sockets given their keepalive
	ran func()        // tests: called after each run
}

type lateEntry struct {
	ss  *session
	due int64 // mono()
}

// delay is how long a session waits for its keepalive: after, or
// keepAliveAfter when a test has not set it.
func (k *lateKeepAlive) delay() time.Duration {
	if k.after == 0 {
		return keepAliveAfter
	}
	return k.after
}

// add queues ss, just begun, whose policy has keepalive on.
func (k *lateKeepAlive) add(ss *session) {
	after := k.delay()
	due := mono() + int64(after)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.q = append(k.q, lateEntry{ss, due})
	if k.armed {
		return
	}
	k.armed = true
	if k.timer == nil {
		k.timer = time.AfterFunc(after, func() { k.apply(mono()) })
		return
	}
	k.timer.Reset(after)
}

// apply gives every session due at now that has not ended its keepalive,
// then arms the timer for the next, if any. A session that has ended is
// left: its descriptor may be another connection's by now, and hold
// refuses a session whose descriptors finish has closed or may be closing.
func (k *lateKeepAlive) apply(now int64) {
	k.mu.Lock()
	n := 0
	for n < len(k.q) && k.q[n].due <= now {
		n++
	}
	due := append([]lateEntry(nil), k.q[:n]...) // set outside the lock: the loops add to q
	m := copy(k.q, k.q[n:])
	clear(k.q[m:])
	k.q = k.q[:m]
	k.mu.Unlock()
	for _, e := range due {
		if !e.ss.hold() {
			continue
		}
		// An error (the socket reset meanwhile) leaves it as it was.
		if setKeepAliveFD(e.ss.backendFD, keepAliveFor(e.ss.pol)) == nil {
			k.set.Add(1)
		}
		e.ss.unref()
	}
	k.mu.Lock()
	if len(k.q) == 0 {
		k.armed = false
	} else {
		k.timer.Reset(max(time.Duration(k.q[0].due-mono()), k.delay()/4))
	}
	k.mu.Unlock()
	if k.ran != nil {
		k.ran()
	}
}

// stop drops the queue and the pending run (Server.Wait: every session has
// ended).
func (k *lateKeepAlive) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.q)
	k.q = k.q[:0]
	if k.timer != nil && k.timer.Stop() {
		k.armed = false
	}
}
