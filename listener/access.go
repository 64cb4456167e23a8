package listener

// The access line every connection ends with, after HAProxy's tcplog: its
// service, client, backend, timers, bytes and end.

import (
	"net/netip"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/sched"
)

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
	held    bool          // the connection is held (hold_timeout): its redials are no passive failures (connectHeld)
	waited  bool          // it waited (a queue, a hold): it looks whether its client left before a dial (gone.go)
	viewAt  time.Time     // taken before the table its backend was picked from was loaded (backend.TrackSince)

	roleEpoch uint64 // its backend's RoleEpoch just before the dial that connected
}

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
