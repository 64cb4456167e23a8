package backend

import (
	"sync"
	"time"
)

// Health: a backend is up unless an active check or passive failures have
// marked it down, or its host name has no address. The state lives here, with the backend, so it survives
// reloads. Transitions are reported on the pool's Changes channel; the
// reload manager, which owns the snapshot, logs them and re-weights.

const (
	downActive  = 1 << iota // active checks failed fall times in a row
	downPassive             // max_fails connect failures within fail_timeout
	downRole                // active checks found it answering in the wrong role fall times in a row
	downResolve             // its host name has no address (yet)
)

// State is a backend's health as the schedulers and status views see it.
// Anything but StateUp takes no new connections.
type State uint8

const (
	StateUp        State = iota
	StateDown            // checks failed, or passive failures
	StateWrongRole       // answers, but as a primary where a replica is wanted or the other way round
)

// The roles a check may observe a backend in (State, Check.Role).
const (
	RolePrimary = "primary"
	RoleReplica = "replica"
)

// String is the state as status views and metrics name it.
func (s State) String() string {
	switch s {
	case StateDown:
		return "down"
	case StateWrongRole:
		return "wrong role"
	case StateDraining:
		return "draining"
	case StateMaint:
		return "maint"
	}
	return "up"
}

// stateOf maps the down bits to a State: a failure outranks a wrong role.
func stateOf(bits int32) State {
	switch {
	case bits&(downActive|downPassive|downResolve) != 0:
		return StateDown
	case bits&downRole != 0:
		return StateWrongRole
	}
	return StateUp
}

// causeOf names the down bits briefly, for status tables.
func causeOf(bits int32) string {
	switch {
	case bits&downResolve != 0:
		return "resolve"
	case bits&downActive != 0:
		return "check"
	case bits&downPassive != 0:
		return "passive"
	}
	return "" // up, or the wrong role: the state says it all
}

// healthState is the part of Backend that health checks and passive
// failures change.
type healthState struct {
	mu           sync.Mutex    // protects the fields below (the down bits are atomic, in Backend)
	reason       string        // why the last transition happened; while checks keep it down, what they fail with now
	upSince      time.Time     // when it last came up; zero if up since it was created
	since        time.Time     // when its State last changed; zero if never
	cause        string        // short form of reason: "check", "passive", "resolve"; "" when up or in the wrong role
	checkOK      int           // consecutive successful checks
	checkFail    int           // consecutive failed checks
	failKind     string        // the error of the latest failed check ("" after a pass)
	failKindN    int           // consecutive failed checks with that same error
	failSince    time.Time     // when the first of those failed
	fails        int           // passive: connect failures in the current window
	windowStart  time.Time     // passive: start of that window
	passiveUntil time.Time     // passive: down until then
	role         string        // the role the last successful check observed; "" if none did
	roleChecked  bool          // a check has observed a role at least once
	awaiting     bool          // set by AwaitRole: the first check result decides at once
	lastRole     string        // the last role any check observed, kept across failed checks; "" if none
	roleFrom     string        // a role change not yet taken by TakeRoleChange: the role before; "" if none
	timeline     uint64        // pgsql: the timeline the last check saw it write on as a primary; 0 if none
	logged       State         // the state the health controller last logged (see Announce)
	loggedAny    bool          // it has logged one
	transitions  uint64        // changes of State since the backend was created
	downFor      time.Duration // time spent out of StateUp in periods that have ended
	downAt       time.Time     // when the current period out of StateUp began; zero while up
	// initial: a backend never seen before awaits its first role check
	// (AwaitRole): that wait and its end are not history (no event, no
	// transition, no downtime), only the start.
	initial bool
}

// History is what a backend's health did since it was created: how many
// times its state changed, and how long it spent out of StateUp (down or
// in the wrong role), the current period included.
type History struct {
	Transitions uint64
	Downtime    time.Duration
}

// History reads the backend's health history at now.
func (b *Backend) History(now time.Time) History {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	h := History{Transitions: b.health.transitions, Downtime: b.health.downFor}
	if at := b.health.downAt; !at.IsZero() && now.After(at) {
		h.Downtime += now.Sub(at)
	}
	return h
}

// Down reports whether the backend is down, by checks or by passive
// failures. One atomic load: schedulers call it on every pick.
func (b *Backend) Down() bool { return b.down.Load() != 0 }

// Health returns whether the backend is up, why it last changed, and since
// when it has been up (zero: up since it was created, or down).
func (b *Backend) Health() (up bool, reason string, upSince time.Time) {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	up = b.down.Load() == 0
	if up {
		upSince = b.health.upSince
	}
	return up, b.health.reason, upSince
}

// State returns the backend's health state and the role its checks last
// observed ("primary", "replica", or "" when no check tells roles apart).
func (b *Backend) State() (s State, role string) {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	return stateOf(b.down.Load()), b.health.role
}

// setBit sets or clears one down bit and reports a change of the overall
// state. Called with health.mu held.
func (b *Backend) setBit(bit int32, on bool, reason string, now time.Time) {
	if on {
		b.setBits(bit, 0, reason, now)
	} else {
		b.setBits(0, bit, reason, now)
	}
}

// setBits sets the bits of set and clears those of clear, and reports a
// change of State (up, down, wrong role). Called with health.mu held.
func (b *Backend) setBits(set, clear int32, reason string, now time.Time) {
	for {
		old := b.down.Load()
		next := old&^clear | set
		if old == next || b.down.CompareAndSwap(old, next) {
			if from, to := stateOf(old), stateOf(next); from != to {
				b.health.reason, b.health.since, b.health.cause = reason, now, causeOf(next)
				if next == 0 {
					b.health.upSince = now
				}
				if b.health.initial {
					b.changed()
					return
				}
				b.health.transitions++
				switch {
				case to != StateUp && b.health.downAt.IsZero():
					b.health.downAt = now
				case to == StateUp && !b.health.downAt.IsZero():
					b.health.downFor += now.Sub(b.health.downAt)
					b.health.downAt = time.Time{}
				}
				b.events.Add(Event{At: now, Service: b.Service, Backend: b.Name, From: from.String(), To: to.String(), Reason: reason})
				b.changed()
			}
			return
		}
	}
}

// changed reports a state transition to the pool's Changes channel without
// blocking; one pending report per backend is enough.
func (b *Backend) changed() {
	if b.changes == nil {
		return
	}
	if b.pending.CompareAndSwap(false, true) {
		select {
		case b.changes <- b:
		default: // the channel is full: the reader rescans everything anyway
			b.pending.Store(false)
		}
	}
}

// Seen marks a report from Changes as read.
func (b *Backend) Seen() { b.pending.Store(false) }

// PassiveFail records a failed connect. With max > 0, max failures within
// window mark the backend down for window (nginx's max_fails/fail_timeout).
// It reports whether this failure took the backend down.
func (b *Backend) PassiveFail(max int, window time.Duration, now time.Time) bool {
	if max <= 0 || window <= 0 {
		return false
	}
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fails == 0 || now.Sub(h.windowStart) > window {
		h.fails, h.windowStart = 0, now
	}
	h.fails++
	b.failing.Store(true)
	if h.fails < max || b.down.Load()&downPassive != 0 {
		return false
	}
	h.fails = 0
	h.passiveUntil = now.Add(window)
	h.checkOK = 0 // with active checks, rise passing checks must confirm it is back (as HAProxy's observe does)
	wasUp := b.down.Load() == 0
	b.setBit(downPassive, true, "passive: connect failed "+itoa(max)+" times within "+window.String(), now)
	return wasUp
}

// PassiveOK records a successful connect: the failure count starts again.
// Without failures to forget it is one atomic load (it runs on every dial).
func (b *Backend) PassiveOK() {
	if !b.failing.Load() || b.down.Load()&downPassive != 0 {
		return // nothing to forget, or a connect that raced the mark: the window decides
	}
	h := &b.health
	h.mu.Lock()
	h.fails = 0
	b.failing.Store(false)
	h.mu.Unlock()
}

// ExpirePassive lifts a passive mark whose time has come and returns when
// the next one expires (zero if none is pending).
func (b *Backend) ExpirePassive(now time.Time) time.Time {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if b.down.Load()&downPassive == 0 {
		return time.Time{}
	}
	if now.Before(h.passiveUntil) {
		return h.passiveUntil
	}
	b.setBit(downPassive, false, "passive: fail_timeout passed", now)
	return time.Time{}
}

// Check is one active check's outcome, as the backend's health takes it.
// Package health runs the checks and decides each one's verdict; the
// backend counts the verdicts toward rise and fall, keeps what they found
// (role, timeline, lag) and counts them (Checks).
type Check struct {
	Start time.Time     // when the check began
	Took  time.Duration // how long it took
	Err   error         // nil: the check passed; else why it failed
	// WrongRole: Err is the server's own answer in the other role, which
	// decides at once, without waiting for fall (see Checked).
	WrongRole bool
	// Local: Err is for want of fulcrum's own resources (descriptors,
	// ports), which says nothing about the backend: the check is kept as
	// the last one, and neither counted nor held against the backend.
	Local bool
	// Role is the role the server answered in: RolePrimary, RoleReplica,
	// or "" when the check tells none or got no answer.
	Role string
	// RoleWanted: the check requires a role, so that an answer in another
	// role than the last one seen is a role change (TakeRoleChange).
	RoleWanted bool
	Timeline   uint64 // pgsql, a primary: the timeline it writes on (see Timeline); 0 = not known
	// Lag is the replication lag the check measured, negative when there
	// is none to measure (a primary) or it could not; with LagSet false
	// the check measured nothing, and the last measure stands (see Lag).
	Lag    time.Duration
	LagSet bool
}

// Checked takes one active check's outcome (see Check): it marks the
// backend down after fall failures in a row, in the wrong role at once,
// and up after rise passes in a row (its first check after AwaitRole
// decides at once, whatever rise and fall say).
func (b *Backend) Checked(c Check, rise, fall int) {
	if c.Local {
		b.checks.recordLocal(c.Start, c.Took, c.Err)
		return
	}
	if c.LagSet {
		b.SetLag(c.Lag)
	}
	moved := b.observed(c.Role, c.Timeline, c.RoleWanted)
	b.checks.record(c.Start, c.Took, c.Err)
	b.checked(c.Err, c.WrongRole, rise, fall, c.Start.Add(c.Took))
	if moved {
		b.changed() // a role change is news even where the state stays (see TakeRoleChange)
	}
}

// SetLag keeps the replication lag a check measured, for Lag; negative:
// unknown (the checks stopped, or measured none).
func (b *Backend) SetLag(d time.Duration) { b.lag.Store(int64(max(d, -1))) }

// observed records what a check saw (a role of "" when it tells none, or
// failed) and reports whether, with a role wanted, the node answers in
// another role than the last check that saw one: it was promoted or
// demoted.
func (b *Backend) observed(role string, timeline uint64, wanted bool) (moved bool) {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.role = role
	if role == "" {
		return false
	}
	h.roleChecked = true
	if role == RolePrimary {
		h.timeline = timeline
	} else {
		h.timeline = 0
	}
	if wanted && h.lastRole != "" && h.lastRole != role {
		b.roles.Add(1) // before the state changes: a connection that can pick it in its new role dials after this (CutRole)
		if h.roleFrom == "" {
			h.roleFrom = h.lastRole
		} else if h.roleFrom == role {
			h.roleFrom = "" // back before anyone looked: no change
		}
		moved = h.roleFrom != ""
	}
	h.lastRole = role
	return moved
}

// TakeRoleChange reports, once, that the backend's checks saw it change
// role (from the role it had to the one it has) since the last call: the
// health controller cuts its sessions then (on_role_change). Only checks
// that want a role report one.
func (b *Backend) TakeRoleChange() (from, to string, ok bool) {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.roleFrom == "" {
		return "", "", false
	}
	from, h.roleFrom = h.roleFrom, ""
	return from, h.lastRole, true
}

// Announce records st as the state the health controller logs for b now
// and reports whether that is news: a state other than the last one
// logged, or the first. A report that carries only a role change logs no
// second "backend up".
func (b *Backend) Announce(st State) bool {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	news := !h.loggedAny || h.logged != st
	h.logged, h.loggedAny = st, true
	return news
}

// Timeline is the PostgreSQL timeline the backend's last check saw it
// write on as a primary (see Check.Timeline); 0 when none is known.
func (b *Backend) Timeline() uint64 {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	return b.health.timeline
}

// ClaimedRole is the role the last check that observed one saw, kept
// across failed checks (State's role is "" after a failed one): a backend
// whose check timed out fewer than fall times is still up and in
// rotation, and still claims what it last answered.
func (b *Backend) ClaimedRole() string {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	return b.health.lastRole
}

// ReasonAwaitingRole is the reason of a backend that AwaitRole holds out
// of rotation until its first role check.
const ReasonAwaitingRole = "waiting for the first role check"

// AwaitRole keeps a backend whose checks now want role, and that no check
// has yet seen in that role, out of rotation until its next check: a
// service that wants a primary must not send writes to a node it has not
// asked (or last saw as a replica). That result then decides at once,
// without waiting for rise or fall. It does nothing to a backend last seen
// in role.
func (b *Backend) AwaitRole(role string) {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.roleChecked && h.role == role || h.awaiting {
		return
	}
	h.awaiting = true
	if b.down.Load() == 0 { // one already out of rotation keeps its state (and its log stays quiet)
		h.initial = h.since.IsZero() && h.transitions == 0
		b.setBits(downActive, 0, ReasonAwaitingRole, time.Now())
	}
}

// AwaitingRole reports whether AwaitRole's first check is still to come:
// the checks then run it at once.
func (b *Backend) AwaitingRole() bool {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	return b.health.awaiting
}

// checked applies one check result. An answer in the wrong role
// (wrongRole) decides at once, without waiting for fall: it is the
// server's own word, not a flaky failure (a promoted replica must leave a replica
// pool before new readers reach it, an old master that turned replica must
// end a split brain now). Other failures count toward fall; the state they
// lead to is StateDown.
func (b *Backend) checked(err error, wrongRole bool, rise, fall int, now time.Time) {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.awaiting {
		h.awaiting = false
		rise, fall = 1, 1
		defer func() { h.initial = false }() // the first result decides, quietly; history starts after it
	}
	if err == nil {
		h.checkOK++
		h.checkFail = 0
		h.failKind, h.failKindN = "", 0
		if h.checkOK >= rise && b.down.Load() != 0 {
			// Active checks outrank a passive mark: rise passes clear every bit.
			b.setBits(0, downPassive|downActive|downRole, "check passed "+itoa(h.checkOK)+" times", now)
		}
		return
	}
	h.checkFail++
	h.checkOK = 0
	if msg := err.Error(); msg != h.failKind {
		// Another kind of failure starts its own count: the reason tells
		// what fails now, not every failure since the last pass (308
		// wrong-role answers do not explain a node that died since).
		h.failKind, h.failKindN, h.failSince = msg, 0, now
	}
	h.failKindN++
	if wrongRole {
		b.setBits(downRole, downActive, err.Error(), now)
		return
	}
	if h.checkFail < fall {
		return
	}
	reason := failedReason(h.failKindN, h.failSince, err)
	b.setBits(downActive, downRole, reason, now)
	if h.cause == "check" {
		h.reason = reason // still down by its checks: the reason follows what fails now (since stays the transition's)
	}
}

// failedReason is a down backend's reason: how many consecutive checks
// have failed with err's own words, since when (the clock time of the
// first: a reason is read later, so a relative age would go stale).
func failedReason(n int, since time.Time, err error) string {
	if n == 1 {
		return "check failed once: " + err.Error()
	}
	return "check failed " + itoa(n) + " times since " + since.Format("15:04:05") + ": " + err.Error()
}

// SetAddressError marks the backend down while its host name has no
// address (err is why, as in "resolve: …"), and clears that mark once it
// has one (err nil).
func (b *Backend) SetAddressError(err error, now time.Time) {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	if err != nil {
		b.setBit(downResolve, true, err.Error(), now)
	} else {
		b.setBit(downResolve, false, "address resolved", now)
	}
}

// StartDown marks a backend down by its active checks before any has run
// (it was down before a restart): rise passing checks bring it up. Without
// active checks, ClearActive lifts it.
func (b *Backend) StartDown(reason string) {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	b.health.checkOK = 0
	b.setBits(downActive, 0, reason, time.Now())
}

// ClearActive marks the backend up as far as active checks go, for when its
// checks are turned off.
func (b *Backend) ClearActive() {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	b.health.checkOK, b.health.checkFail = 0, 0
	b.health.failKind, b.health.failKindN = "", 0
	b.health.role, b.health.awaiting = "", false
	b.health.lastRole, b.health.roleFrom, b.health.timeline = "", "", 0
	b.setBits(0, downActive|downRole, "checks off", time.Now())
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
