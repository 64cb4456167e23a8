package listener

import (
	"time"

	"fulcrum/internal/sockfd"
)

// The global connection limit. Every proxied connection holds two
// descriptors (client and backend), so a daemon whose descriptor table
// fills up fails in the worst places: a dial fails with EMFILE, which must
// never be held against the backend, and accept-then-close turns clients
// away that the kernel's backlog would have kept waiting. As HAProxy derives
// maxconn from ulimit -n, the Server derives a limit from RLIMIT_NOFILE at
// New: half of what is left after a reserve for dials in flight, health
// checks, the admin listener, listening sockets and splice pipes. An accept
// loop at the limit stops accepting (clients wait in the kernel backlog)
// and resumes the moment a connection ends.

// reserveFDs is how many descriptors the limit leaves for everything but
// proxied connections: a tenth of the table, at least 128.
func reserveFDs(nofile int) int { return max(128, nofile/10) }

// pipeLimit is how many splice pipes may be open at once (lent or kept,
// two descriptors each): half the reserve. A direction that finds none
// copies through its buffer instead, so the pipes can never take the
// descriptors a connection under the limit needs (its dial's socket).
func pipeLimit(nofile int) int { return reserveFDs(nofile) / 4 }

// connLimit is the number of connections a descriptor table of nofile
// entries holds with the reserve kept; at least 1.
func connLimit(nofile int) int { return max(1, (nofile-reserveFDs(nofile))/2) }

// nofile is the process's RLIMIT_NOFILE soft limit, or 1<<20 when unknown.
func nofile() int {
	cur, _, err := sockfd.Nofile()
	if err != nil || cur > 1<<30 {
		return 1 << 20
	}
	return int(cur)
}

// MaxConns is the global connection limit: connections accepted and not yet
// ended, on all listeners together.
func (s *Server) MaxConns() int { return cap(s.slots) }

// Conns is how many connections hold a slot of the global limit now.
func (s *Server) Conns() int { return len(s.slots) }

// LimitStats is the global connection limit as status views show it.
type LimitStats struct {
	Open  int    // connections holding a slot
	Max   int    // the limit (MaxConns)
	Waits uint64 // times an accept goroutine waited at the limit
}

// Limit reads the global connection limit's counters.
func (s *Server) Limit() LimitStats {
	return LimitStats{Open: len(s.slots), Max: cap(s.slots), Waits: s.atLimit.Load()}
}

// takeSlot waits for a slot of the global limit for so's next accept, which
// a client waits for while every slot is taken (acceptRaw). It reports false
// when so is taken out of service meanwhile. While it waits, it keeps
// answering the heartbeat: a daemon at its limit is busy, not stuck, and the
// watchdog must not restart it.
func (s *Server) takeSlot(so *socket) bool {
	select {
	case s.slots <- struct{}{}: // one came free since acceptRaw looked
		return true
	default:
	}
	s.atLimit.Add(1)
	// An episode at the limit is announced at most once a second (with
	// how many began since the last one announced), and its end only if
	// its start was: churn at the limit begins and ends an episode per
	// connection, which logged two lines for each (issue 30).
	if !s.limited.Swap(true) {
		if held, ok := s.limitLog.Allow(); ok {
			s.limitTold.Store(true)
			s.log.Warn().Int("max_conns", cap(s.slots)).Int("nofile", nofile()).Uint64("suppressed", held).
				Msg("connection limit reached: new clients wait in the listen backlog until connections end")
		}
	}
	var beat <-chan time.Time
	if d := time.Duration(s.beat.Load()); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		beat = t.C
	}
	for {
		so.beat.Store(time.Now().UnixNano())
		select {
		case s.slots <- struct{}{}:
			if s.limited.Swap(false) && s.limitTold.Swap(false) {
				s.log.Info().Int("max_conns", cap(s.slots)).Msg("below the connection limit again")
			}
			return true
		case <-so.done:
			return false
		case <-beat:
		}
	}
}

// connDone ends a connection that took a slot: the slot is free for the
// next accept, and the Server's count of running work drops.
func (s *Server) connDone() {
	<-s.slots
	s.wg.Done()
}
