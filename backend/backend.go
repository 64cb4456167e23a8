// Package backend holds what fulcrum knows about each backend server and
// keeps across reloads: its identity (service and name), live counters,
// health and drain state. The health state is what the checks' results set
// (Checked, PassiveFail); package health runs the checks.
//
// Settings that a reload may change (address, weight, limits) live in the
// scheduler snapshot, not here. A Backend is shared by every snapshot that
// names it, so the counters of a backend whose name is kept survive a reload.
//
// Typical use, on the per-connection path (Example runs it):
//
//	if !b.Acquire(maxConns) {
//		// full or draining: pick another
//	}
//	defer b.Release()
//	... dial, then b.Track(session) so that a drain deadline can close it,
//	and b.Untrack(session) when it ends.
//
// The package only counts and tracks; it never dials or closes on its own,
// except that Drain closes the sessions still tracked at its deadline.
package backend

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is one backend server of one service.
type Backend struct {
	Service string // the service's name
	Name    string // the backend's name, unique in its service

	active       atomic.Int64  // connections holding a slot: dialling or open
	limit        atomic.Int64  // the max of the last Acquire; 0 = unlimited
	total        atomic.Uint64 // connections that took a slot
	bytesIn      atomic.Uint64 // client → backend
	bytesOut     atomic.Uint64 // backend → client
	connectFails atomic.Uint64
	drainClosed  atomic.Uint64 // sessions closed at a drain deadline
	cutClosed    atomic.Uint64 // sessions closed by Cut (on_down, on_role_change, on_up, split brain)
	draining     atomic.Bool   // no new connections; set by Drain, cleared by Undrain
	closing      atomic.Bool   // the drain deadline passed: sessions are being closed
	drainAt      atomic.Int64  // unix nanoseconds when the current drain began; 0 when not draining
	zeroAt       atomic.Int64  // unix nanoseconds when its configured weight became 0 (NoteWeight); 0 while above 0
	ovr          override      // the operator's state (`fulcrum set`); see Condition
	checks       checkStats    // active check results and durations, for status and metrics

	down    atomic.Int32    // health: downActive | downPassive bits; 0 = up
	health  healthState     // health details, under its own mutex
	changes chan<- *Backend // where health transitions are reported; nil = nowhere
	events  *Events         // where state changes are recorded; nil = nowhere
	lag     atomic.Int64    // replication lag its last check measured, in nanoseconds; -1: unknown
	pending atomic.Bool     // a report is in changes, not yet Seen
	failing atomic.Bool     // passive: a failure count is pending (PassiveOK's fast path)
	roles   atomic.Uint64   // how many times its checks saw it answer in another role (RoleEpoch)

	mu       sync.Mutex             // protects sessions, cutAt and cutEnd
	sessions map[io.Closer]struct{} // open sessions, closed by Drain at its deadline
	cutAt    time.Time              // when the last Cut ran; zero: never
	cutEnd   string                 // and why
	roleCut  uint64                 // the RoleEpoch the last CutRole ran at: a session dialled before it, tracked after, is cut too
}

// New returns a backend with zeroed counters.
func New(service, name string) *Backend {
	b := &Backend{Service: service, Name: name, sessions: map[io.Closer]struct{}{}}
	b.lag.Store(-1)
	return b
}

// Lag is the replication lag the backend's last check measured (a pgsql
// check of a replica); ok is false when no check measured one.
func (b *Backend) Lag() (lag time.Duration, ok bool) {
	n := b.lag.Load()
	return time.Duration(n), n >= 0
}

// Acquire takes a connection slot. It fails when the backend is draining or,
// with max > 0, when max slots are already taken; a dial in progress holds a
// slot, so max is never exceeded.
func (b *Backend) Acquire(max int) bool {
	if b.draining.Load() || b.ovr.v.Load() != 0 {
		return false
	}
	if int64(max) != b.limit.Load() {
		b.limit.Store(int64(max)) // for free: a reload may change it, rarely
	}
	if max <= 0 {
		b.active.Add(1)
	} else {
		for {
			n := b.active.Load()
			if n >= int64(max) {
				return false
			}
			if b.active.CompareAndSwap(n, n+1) {
				break
			}
		}
	}
	b.total.Add(1)
	return true
}

// Release returns a slot taken by Acquire. A connection queued for one is
// the listener's to wake.
func (b *Backend) Release() {
	b.active.Add(-1)
}

// Free reports whether b could take a connection now: not draining, and
// below the max its connections last asked for.
func (b *Backend) Free() bool {
	l := b.limit.Load()
	return !b.draining.Load() && (l <= 0 || b.active.Load() < l)
}

// Active is the number of slots taken now.
func (b *Backend) Active() int64 { return b.active.Load() }

// Draining reports whether the backend is draining after its removal (or at
// shutdown). An operator's drain (SetOverride) is not this; Takes and
// Condition see both.
func (b *Backend) Draining() bool { return b.draining.Load() }

// ConnectFailed counts a failed dial.
func (b *Backend) ConnectFailed() { b.connectFails.Add(1) }

// AddBytes counts bytes forwarded: in from the client, out to it.
func (b *Backend) AddBytes(in, out int64) {
	if in > 0 {
		b.bytesIn.Add(uint64(in))
	}
	if out > 0 {
		b.bytesOut.Add(uint64(out))
	}
}

// Track registers an open session so that Drain can close it at its
// deadline. It returns false when that deadline has already passed; the
// caller must then close the session itself.
func (b *Backend) Track(s io.Closer) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing.Load() {
		return false
	}
	b.sessions[s] = struct{}{}
	return true
}

// TrackSince is Track for a session admitted on a view of the backend (a
// table) taken at since. A Cut that ran after since did not see the
// session, and would have ended it (it was picked before the Cut's cause
// was acted on): such a session is not tracked but counted as cut, and
// cut is the Cut's reason, with which the caller ends it. Track and Cut
// share the lock: either the Cut sees the session, or this sees the Cut.
// A session dialled before the last CutRole's role change (RoleEpocher)
// is cut likewise; one dialled since is tracked whatever its since.
// ok is false when the drain deadline has already passed, as for Track.
func (b *Backend) TrackSince(s io.Closer, since time.Time) (ok bool, cut string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing.Load() {
		return false, ""
	}
	if b.cutAt.After(since) {
		b.cutClosed.Add(1)
		return true, b.cutEnd
	}
	if e, ok := s.(RoleEpocher); ok && e.RoleEpoch() < b.roleCut { // dialled in a role CutRole ended
		b.cutClosed.Add(1)
		return true, CutRoleChange
	}
	b.sessions[s] = struct{}{}
	return true, ""
}

// Untrack removes a session registered by Track.
func (b *Backend) Untrack(s io.Closer) {
	b.mu.Lock()
	delete(b.sessions, s)
	b.mu.Unlock()
}

// Stats is a point-in-time copy of a backend's counters.
type Stats struct {
	Active       int64
	Total        uint64
	BytesIn      uint64 // client → backend
	BytesOut     uint64 // backend → client
	ConnectFails uint64
	DrainClosed  uint64 // sessions closed because a drain deadline passed
	CutClosed    uint64 // sessions closed by Cut: the backend went down or wrong-role (on_down), or a primary came back (on_up)
	Draining     bool
}

// Stats reads the counters. Each is read atomically; together they are not a
// single snapshot.
func (b *Backend) Stats() Stats {
	return Stats{
		Active:       b.active.Load(),
		Total:        b.total.Load(),
		BytesIn:      b.bytesIn.Load(),
		BytesOut:     b.bytesOut.Load(),
		ConnectFails: b.connectFails.Load(),
		DrainClosed:  b.drainClosed.Load(),
		CutClosed:    b.cutClosed.Load(),
		Draining:     b.draining.Load(),
	}
}

// Undrain lets a draining backend take connections again (it was re-added).
func (b *Backend) Undrain() {
	b.mu.Lock()
	b.draining.Store(false)
	b.closing.Store(false)
	b.drainAt.Store(0)
	b.mu.Unlock()
}

// StopNew makes Acquire refuse from now on: the first step of Drain, for a
// caller that must know it has happened before starting Drain elsewhere.
func (b *Backend) StopNew() {
	if !b.draining.Swap(true) {
		b.drainAt.Store(time.Now().UnixNano())
	}
}

// Drain stops new connections and waits for open ones to end. When ctx ends
// first, it closes the sessions still open and returns how many it closed.
// It returns early, closing nothing, if Undrain is called meanwhile.
//
// Like net/http's Server.Shutdown it polls, from 1 ms doubling to 500 ms.
func (b *Backend) Drain(ctx context.Context) (closed int) {
	b.StopNew()
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if b.active.Load() <= 0 || !b.draining.Load() {
			return 0
		}
		select {
		case <-ctx.Done():
			return b.closeAll()
		case <-t.C:
			wait = min(2*wait, 500*time.Millisecond)
			t.Reset(wait)
		}
	}
}

func (b *Backend) closeAll() int {
	b.mu.Lock()
	if !b.draining.Load() { // undrained meanwhile
		b.mu.Unlock()
		return 0
	}
	b.closing.Store(true)
	open := make([]io.Closer, 0, len(b.sessions))
	for s := range b.sessions {
		open = append(open, s)
	}
	b.mu.Unlock()
	b.drainClosed.Add(uint64(len(open)))
	for _, s := range open {
		s.Close() // teardown: the session logs its own end
	}
	return len(open)
}

// Why Cut ended a backend's sessions: the access log's end for them.
const (
	CutDown       = "backend down" // on_down = "close": it went down or into the wrong role
	CutRoleChange = "role change"  // on_role_change = "close": it answered in another role than before
	CutSplitBrain = "split brain"  // a split brain began, and it is a claimant that is not the one writer
	CutBackup     = "primary back" // on_up = "close-backups": a primary backend came back
	CutWriter     = "writer moved" // failback with on_down = "close": another backend became the writer while it was up
)

// Cutter is a tracked session that can say why it was closed: Cut passes
// its reason (one of the Cut* constants) to such a session instead of
// calling Close.
type Cutter interface {
	Cut(end string)
}

// Cut closes every open session at once and returns how many it closed,
// each with end as its reason (see Cutter): on_down = "close" when the
// backend goes down or into the wrong role, on_role_change = "close" when
// it changes role, a split brain it claims in, and on_up = "close-backups"
// on a backup when a primary backend comes back. New connections are
// unaffected; the schedulers stop picking a backend that is down on their
// own.
func (b *Backend) Cut(end string) int {
	return b.cut(end, func(io.Closer) bool { return true }, func() {
		b.cutAt, b.cutEnd = time.Now(), end // for a session tracked after it (TrackSince)
	})
}

// RoleEpoch counts the role changes the backend's checks have seen. A
// connection reads it just before it dials the backend, and its session
// reports it (RoleEpocher), so that CutRole can tell a session that began
// in the backend's old role from one that began in its new one.
func (b *Backend) RoleEpoch() uint64 { return b.roles.Load() }

// RoleEpocher is a tracked session that says the RoleEpoch its backend
// had just before it was dialled.
type RoleEpocher interface {
	RoleEpoch() uint64
}

// CutRole is Cut for on_role_change: it ends only the sessions dialled
// before the backend's checks last saw it change role (a RoleEpocher with
// an older epoch, and any session that is none). A session dialled since
// began with the node in its new role: the connections held through a
// failover (hold_timeout) dial the promoted node as soon as its check
// passes, before the health controller gets to the cut, and ending them
// would refuse the very clients the hold was for.
func (b *Backend) CutRole(end string) int {
	now := b.roles.Load()
	return b.cut(end, func(s io.Closer) bool {
		e, ok := s.(RoleEpocher)
		return !ok || e.RoleEpoch() < now
	}, func() { b.roleCut = max(b.roleCut, now) }) // not cutAt: a session dialled in the new role is tracked (TrackSince)
}

// cut closes the open sessions for which which is true (see Cut).
func (b *Backend) cut(end string, which func(io.Closer) bool, mark func()) int {
	b.mu.Lock()
	mark() // under the lock, for a session tracked after it (TrackSince)
	open := make([]io.Closer, 0, len(b.sessions))
	for s := range b.sessions {
		if which(s) {
			open = append(open, s)
			delete(b.sessions, s) // each is cut once, counted once, however many reasons follow
		}
	}
	b.mu.Unlock()
	b.cutClosed.Add(uint64(len(open)))
	for _, s := range open {
		if c, ok := s.(Cutter); ok {
			c.Cut(end) // teardown: the session logs its own end
		} else {
			s.Close()
		}
	}
	return len(open)
}
