// Package status is fulcrum's one status type: what the admin listener
// serves as /status JSON, what `fulcrum status` prints, what /metrics is
// gathered from and what the systemd STATUS= line sums up. It owns no
// state; Of reads the snapshot and the live counters at the time of asking.
// Whether a backend is up is not decided here: sched.Target.Up decides, as
// for the schedulers and /healthz, and this package names the outcome
// (sched.Service.Condition).
//
// Typical use: see Example. main and reload pass the listener.Server's
// Snapshot and the reload.Manager's Status and Draining:
//
//	st := status.Of(status.Source{Snapshot: srv.Snapshot, Reloads: m.Status, Draining: m.Draining})
//	line := st.Line() // "generation 3; 2 services; backends 3/4 up; 12 connections"
package status

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"fulcrum/backend"
	"fulcrum/cluster"
	"fulcrum/listener"
	"fulcrum/sched"
)

// Source is what a status is read from. Nil funcs are skipped.
type Source struct {
	// Snapshot is the running snapshot: the table, and each service's
	// admission policy (its max_conns). Read once per status.
	Snapshot func() *listener.Snapshot
	Reloads  func() Reload                 // the reload history
	Sockets  func() []listener.SocketStats // per-listener counters
	Limit    func() listener.LimitStats    // the process's connection limit
	Draining func() []Drain                // backends draining after their removal (or at shutdown)
	// Admission reads a service's admission counters (listener.Server's
	// Admission); nil: not shown.
	Admission func(service string) (listener.AdmissionStats, bool)
	// Instance answers for the instance's drain and /healthz; nil: none.
	Instance *cluster.Instance
	Version  string
	// Watcher knows each service's own state (fallback, holding) and
	// since when; nil: not shown.
	Watcher *Watcher
	// Events lists the recent state changes, oldest first; nil: none.
	Events func() []backend.Event
	// Now is the time of asking; nil: time.Now.
	Now func() time.Time
}

// Drain is a backend being drained: removed from the configuration and
// still holding sessions, or drained at shutdown. It stays listed until
// its last session ends or its deadline closes them.
type Drain struct {
	B        *backend.Backend
	Addr     netip.AddrPort
	Backup   bool
	Deadline time.Time // when the sessions still open are closed; zero: never (drain_timeout 0)
}

// Status is the live snapshot.
type Status struct {
	Version    string          `json:"version,omitempty"`
	Instance   *cluster.Status `json:"instance,omitempty"` // drain state and /healthz's verdict
	Generation uint64          `json:"generation"`
	Reload     Reload          `json:"reload"`
	Services   []Service       `json:"services"`
	Listeners  []Listener      `json:"listeners"`
	// Connections is the process's connection limit (derived from
	// RLIMIT_NOFILE) and its use; nil when not known.
	Connections *Connections `json:"connections,omitempty"`
	// Events are the last state changes of backends and services, oldest
	// first, as the pool's ring keeps them across reloads.
	Events []backend.Event `json:"events,omitempty"`
}

// Connections is the process's connection limit and its use.
type Connections struct {
	Open  int    `json:"open"`  // connections accepted and not ended
	Max   int    `json:"max"`   // the limit: accepting stops there
	Waits uint64 `json:"waits"` // times accepting stopped at the limit
}

// Reload is the reload history.
type Reload struct {
	Generation  uint64    `json:"-"` // of the running table (Status.Generation); 0 before the first apply
	Applied     time.Time `json:"applied"`
	Reloads     uint64    `json:"reloads"` // applied, the first configuration excluded
	Failed      uint64    `json:"failed"`  // refused
	LastError   string    `json:"last_error,omitempty"`
	LastAttempt time.Time `json:"last_attempt"`
}

// Service is one service.
type Service struct {
	Name      string            `json:"name"`
	Scheduler string            `json:"scheduler"`
	Listen    []string          `json:"listen"`
	Active    int64             `json:"active"`  // connections holding a service slot
	Waiting   int64             `json:"waiting"` // in the queue now
	Retries   uint64            `json:"retries"`
	Queued    uint64            `json:"queued"`
	Refused   uint64            `json:"refused"`
	Rejected  map[string]uint64 `json:"rejected,omitempty"` // turned away before any dial, by reason
	// SplitBrain names the backends claiming primary at once; absent when
	// at most one does. SplitBrains counts how often that began.
	SplitBrain  []string `json:"split_brain,omitempty"`
	SplitWriter string   `json:"split_writer,omitempty"` // the claimant kept as the writer (split_brain first or newest); absent while it refuses
	SplitBrains uint64   `json:"split_brains"`
	Writer      string   `json:"writer,omitempty"` // scheduler first with failback: the backend kept as the writer
	// MaxConns is the service's max_conns, its connections at once (the
	// limit of Active); absent: none.
	MaxConns int `json:"max_conns,omitempty"`
	// Holding is how many connections wait for an eligible backend now
	// (hold_timeout); Held how many had to, HoldExpired how many of those
	// were closed when it ran out.
	Holding     int64  `json:"holding"`
	Held        uint64 `json:"held"`
	HoldExpired uint64 `json:"hold_expired"`
	// Unserved counts the connections fulcrum ended without a backend, by
	// the end reason of their access line: "no backend", "connect failed",
	// "full".
	Unserved map[string]uint64 `json:"unserved,omitempty"`
	// Serving says where new connections go now: "own" backends, its
	// "fallback" (Fallback names it), "holding" them (hold_timeout) or
	// "refusing" them; ServingSince is since when (absent: since start).
	// Fallbacks counts the times it began to use its fallback.
	Serving      string    `json:"serving,omitempty"`
	ServingSince time.Time `json:"serving_since,omitzero"`
	Fallback     string    `json:"fallback,omitempty"`
	Fallbacks    uint64    `json:"fallbacks"`
	// Hint is what the status suggests beyond the states: when every
	// backend's check fails to log in, the check's own credentials.
	Hint     string    `json:"hint,omitempty"`
	Backends []Backend `json:"backends"`
}

// Backend is one backend: its settings in this generation, its state by
// sched.Service.Condition, its last check and its live counters.
type Backend struct {
	Name       string `json:"name"`
	Address    string `json:"address"`
	Weight     int    `json:"weight"`            // effective: 0 while not up, ramping during slow start
	Configured int    `json:"configured_weight"` // as in the file
	Backup     bool   `json:"backup,omitempty"`
	State      string `json:"state"`           // up | down | wrong role | draining | maint
	Cause      string `json:"cause,omitempty"` // short reason: check, passive, resolve, weight 0, removed, stopping, set drain, set maint
	Role       string `json:"role,omitempty"`  // primary | replica, as its role check last saw it
	Reason     string `json:"reason,omitempty"`
	// Since is when the backend entered its state; absent if unknown (up
	// since start).
	Since time.Time `json:"since,omitzero"`
	// Override is the operator's `fulcrum set` state when not ready.
	Override string `json:"override,omitempty"`
	// Removed: no longer in the configuration, listed while it drains.
	Removed bool `json:"removed,omitempty"`
	// DrainDeadline is when a drain closes the sessions still open; absent
	// when not draining or when the drain waits for ever.
	DrainDeadline time.Time  `json:"drain_deadline,omitzero"`
	LastCheck     *LastCheck `json:"last_check,omitempty"`

	Active       int64  `json:"active"`
	Total        uint64 `json:"total"`
	BytesIn      uint64 `json:"bytes_in"`
	BytesOut     uint64 `json:"bytes_out"`
	ConnectFails uint64 `json:"connect_failures"`
	DrainClosed  uint64 `json:"drain_closed"`
	CutClosed    uint64 `json:"cut_closed"` // sessions ended by on_down / on_up

	// Transitions counts its health state changes since it was first
	// configured; DowntimeSeconds is the time it spent down or in the wrong
	// role, the current period included.
	Transitions     uint64  `json:"transitions"`
	DowntimeSeconds float64 `json:"downtime_seconds"`
	// LagSeconds is the replication lag its last check measured (a pgsql
	// check of a replica); absent when none did.
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// Limit is its max_conns; 0: none.
	Limit int `json:"max_conns,omitempty"`

	// Checks are the active check counters, for metrics only.
	Checks backend.CheckStats `json:"-"`
}

// LastCheck is the last active check's outcome.
type LastCheck struct {
	At        time.Time `json:"at"`
	OK        bool      `json:"ok"`
	Error     string    `json:"error,omitempty"`
	LatencyMS float64   `json:"latency_ms"`
}

// Up reports whether the backend takes new connections.
func (b Backend) Up() bool { return b.State == "up" }

// Listener is one listening socket.
type Listener struct {
	Listen       string `json:"listen"`
	Addr         string `json:"addr"`
	Accepts      uint64 `json:"accepts"`
	AcceptErrors uint64 `json:"accept_errors"`
	Inherited    bool   `json:"inherited,omitempty"`
	// Routing by name (docs/routing.md): the address's routes in order,
	// and the connections it turned away before any service, by reason
	// (no-route, hello-malformed, hello-too-large, preread-timeout,
	// hello-closed). Both empty on an address that is not routed.
	Routes  []Route           `json:"routes,omitempty"`
	Refused map[string]uint64 `json:"refused,omitempty"`
}

// Route is one service's route on a listen address shared by name.
type Route struct {
	Service string   `json:"service"`
	SNI     []string `json:"sni"`
	ALPN    []string `json:"alpn,omitempty"`
}

// Of reads src into a Status.
func Of(src Source) Status {
	st := Status{Version: src.Version}
	now := time.Now()
	if src.Now != nil {
		now = src.Now()
	}
	if src.Events != nil {
		st.Events = src.Events()
	}
	if src.Instance != nil {
		is := src.Instance.Status()
		st.Instance = &is
	}
	var all []Drain
	if src.Draining != nil {
		all = src.Draining()
	}
	drains := map[*backend.Backend]Drain{}
	for _, d := range all {
		drains[d.B] = d
	}
	var snap *listener.Snapshot
	if src.Snapshot != nil {
		snap = src.Snapshot()
	}
	var t *sched.Table
	if snap != nil {
		t = snap.Table
	}
	inTable := map[*backend.Backend]bool{}
	if t != nil {
		st.Generation = t.Gen
		for _, s := range t.Services {
			for _, tg := range s.All() {
				inTable[tg.B] = true
			}
		}
	}
	var removed []Drain // draining and not in the table, in the order given
	for _, d := range all {
		if !inTable[d.B] {
			removed = append(removed, d)
		}
	}
	if t != nil {
		for _, s := range t.Services {
			ss := Service{Name: s.Name, Scheduler: string(s.Scheduler), SplitBrain: s.SplitBrain, SplitWriter: s.SplitWriter, Writer: s.Writer,
				MaxConns: snap.Policy(s).MaxConns}
			if src.Admission != nil {
				if g, ok := src.Admission(s.Name); ok {
					ss.Active, ss.Waiting, ss.Retries, ss.Queued, ss.Refused = g.Active, g.Waiting, g.Retries, g.Queued, g.Refused
					ss.SplitBrains = g.Splits
					ss.Holding, ss.Held, ss.HoldExpired = g.Holding, g.Held, g.HoldExpired
					ss.Unserved, ss.Rejected = g.Unserved, g.Rejected
				}
			}
			if src.Watcher != nil {
				ws := src.Watcher.State(s.Name)
				ss.Serving, ss.ServingSince, ss.Fallback, ss.Fallbacks = ws.Serving, ws.Since, ws.Fallback, ws.Fallbacks
			}
			for _, a := range s.Listen {
				ss.Listen = append(ss.Listen, a.String())
			}
			all := s.All()
			for i := range all {
				tg := &all[i]
				b := backendOf(tg.B, s.Condition(tg), tg.Addr, tg.Base, i >= len(s.Targets), now)
				b.Limit = tg.MaxConns
				if tg.Host != "" { // a name: say which, and whether it has an address yet
					if tg.Addr.Addr().IsValid() {
						b.Address = tg.Host + " (" + tg.Addr.String() + ")"
					} else {
						b.Address = tg.Host + " (unresolved)"
					}
				}
				b.Weight = tg.Weight
				if !b.Up() {
					b.Weight = 0
				}
				if d, ok := drains[tg.B]; ok {
					b.DrainDeadline = d.Deadline
					if b.Cause == "removed" { // still in the table: the whole instance is stopping
						b.Cause, b.Reason = "stopping", "draining for shutdown"
					}
				}
				ss.Backends = append(ss.Backends, b)
			}
			removed = slices.DeleteFunc(removed, func(d Drain) bool {
				if d.B.Service != s.Name {
					return false
				}
				ss.Backends = append(ss.Backends, removedOf(d))
				return true
			})
			ss.Hint = credentialsHint(ss.Backends)
			st.Services = append(st.Services, ss)
		}
	}
	// Removed with their service: listed under the service's name.
	for len(removed) > 0 {
		name := removed[0].B.Service
		ss := Service{Name: name}
		removed = slices.DeleteFunc(removed, func(d Drain) bool {
			if d.B.Service != name {
				return false
			}
			ss.Backends = append(ss.Backends, removedOf(d))
			ss.Active += d.B.Active()
			return true
		})
		st.Services = append(st.Services, ss)
	}
	if src.Reloads != nil {
		st.Reload = src.Reloads()
	}
	if src.Limit != nil {
		l := src.Limit()
		st.Connections = &Connections{Open: l.Open, Max: l.Max, Waits: l.Waits}
	}
	if src.Sockets != nil {
		for _, so := range src.Sockets() {
			l := Listener{Listen: so.Listen.String(), Addr: so.Addr,
				Accepts: so.Accepts, AcceptErrors: so.AcceptErrors, Inherited: so.Inherited, Refused: so.Refused}
			if t != nil {
				if rs := t.Routes(so.Listen); rs != nil {
					for _, r := range rs.List() {
						l.Routes = append(l.Routes, Route{Service: r.Service.Name, SNI: r.Names, ALPN: r.ALPN})
					}
				}
			}
			st.Listeners = append(st.Listeners, l)
		}
	}
	return st
}

// removedOf is a removed backend still draining.
func removedOf(d Drain) Backend {
	b := backendOf(d.B, d.B.Condition(0), d.Addr, 0, d.Backup, time.Now())
	b.Removed, b.DrainDeadline = true, d.Deadline
	return b
}

// backendOf reads one backend, in condition c, whose configured weight is
// base.
func backendOf(bk *backend.Backend, c backend.Condition, addr netip.AddrPort, base int, backup bool, now time.Time) Backend {
	h := bk.History(now)
	s := bk.Stats()
	_, role := bk.State()
	b := Backend{Name: bk.Name, Address: addr.String(), Configured: base, Backup: backup,
		State: c.State.String(), Cause: c.Cause, Role: role, Reason: c.Reason, Since: c.Since,
		Active: s.Active, Total: s.Total, BytesIn: s.BytesIn, BytesOut: s.BytesOut,
		ConnectFails: s.ConnectFails, DrainClosed: s.DrainClosed, CutClosed: s.CutClosed,
		Checks: bk.Checks(), Transitions: h.Transitions, DowntimeSeconds: h.Downtime.Seconds()}
	if lag, ok := bk.Lag(); ok {
		v := lag.Seconds()
		b.LagSeconds = &v
	}
	if c.State == backend.StateUp {
		b.Reason = "" // the reason it last came up is history, not state
	}
	if o, _, _ := bk.Override(); o != backend.Ready {
		b.Override = o.String()
	}
	if l := b.Checks.Last; !l.At.IsZero() {
		b.LastCheck = &LastCheck{At: l.At, OK: l.Err == "", Error: l.Err, LatencyMS: float64(l.Latency.Microseconds()) / 1000}
	}
	return b
}

// Line is the one-line summary systemd shows (STATUS=): generation,
// services, backends up of those configured, open connections, removed
// backends still draining, and the last reload error if the last attempt
// was refused.
func (st Status) Line() string {
	if st.Generation == 0 {
		return "starting"
	}
	up, total, draining, open, services := 0, 0, 0, int64(0), 0
	for _, s := range st.Services {
		if s.Scheduler != "" {
			services++
		}
		for _, b := range s.Backends {
			open += b.Active
			if b.Removed {
				draining++
				continue
			}
			total++
			if b.Up() {
				up++
			}
		}
	}
	line := fmt.Sprintf("generation %d; %d services; backends %d/%d up; %d connections", st.Generation, services, up, total, open)
	if draining > 0 {
		line += fmt.Sprintf("; %d removed backends draining", draining)
	}
	if st.Reload.LastError != "" {
		line += "; last reload failed: " + st.Reload.LastError
	}
	return line
}

// authFailures are the words each database answers a failed login with.
var authFailures = []string{"password authentication failed", "SQLSTATE 28P01", "SQLSTATE 28000", "Access denied for user",
	"WRONGPASS", "NOAUTH", "invalid password", "invalid username-password pair"}

// credentialsHint says that the check's own credentials are probably wrong
// when every backend (two at least) last failed its check with a login
// error: one server refusing is that server's business; all of them
// refusing is the user or password_file the checks share.
func credentialsHint(bs []Backend) string {
	n := 0
	for _, b := range bs {
		if b.Removed {
			continue
		}
		c := b.LastCheck
		if c == nil || c.OK || !slices.ContainsFunc(authFailures, func(w string) bool { return strings.Contains(c.Error, w) }) {
			return ""
		}
		n++
	}
	if n < 2 {
		return ""
	}
	return "every backend refuses the check's login: the check's own credentials (user, password_file) are probably wrong, not the servers"
}
