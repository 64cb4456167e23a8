package backend

import (
	"sync/atomic"
	"time"
)

// The availability rule lives here, in one place: whether a backend takes
// new connections, and how status views, metrics, /healthz and the systemd
// STATUS line name its state. The schedulers apply the same rule through
// Takes (atomics only, per pick); Condition adds the why and since when.

// More states, beside the health states of State: those a backend is put in
// by its configuration or an operator rather than by its checks.
const (
	StateDraining State = iota + 3 // no new connections, sessions run on: weight 0, removed, or `fulcrum set … drain`
	StateMaint                     // `fulcrum set … maint`: no new connections, and not counted up whatever its checks say
)

// Override is an operator's runtime state for a backend (`fulcrum set`),
// kept with the backend across reloads and cleared by Ready or by the
// backend's removal.
type Override int32

const (
	Ready Override = iota // no override: the file and the checks decide
	Drain                 // no new connections; open sessions run on (HAProxy's DRAIN)
	Maint                 // no new connections and never up (HAProxy's MAINT)
)

// String names the override as `fulcrum set` takes it.
func (o Override) String() string {
	switch o {
	case Drain:
		return "drain"
	case Maint:
		return "maint"
	}
	return "ready"
}

// ParseOverride reads "drain", "maint" or "ready".
func ParseOverride(s string) (Override, bool) {
	for _, o := range []Override{Ready, Drain, Maint} {
		if o.String() == s {
			return o, true
		}
	}
	return Ready, false
}

// override is the operator's state and since when, beside the atomic the
// pick path reads.
type override struct {
	v     atomic.Int32 // an Override; read by Takes on every pick
	since atomic.Int64 // unix nanoseconds of the last SetOverride that changed it
	by    atomic.Pointer[string]
}

// SetOverride sets the operator's state; by says who asked (logged and
// shown). It reports whether it changed.
func (b *Backend) SetOverride(o Override, by string, now time.Time) bool {
	was := Override(b.ovr.v.Swap(int32(o)))
	if was == o {
		return false
	}
	b.ovr.since.Store(now.UnixNano())
	b.ovr.by.Store(&by)
	b.events.Add(Event{At: now, Service: b.Service, Backend: b.Name, From: "set " + was.String(), To: "set " + o.String(), Reason: by})
	return true
}

// Override returns the operator's state, who set it and when (zero when
// never set).
func (b *Backend) Override() (o Override, by string, since time.Time) {
	o = Override(b.ovr.v.Load())
	if p := b.ovr.by.Load(); p != nil {
		by = *p
	}
	if n := b.ovr.since.Load(); n != 0 {
		since = time.Unix(0, n)
	}
	return o, by, since
}

// Takes reports whether the backend takes new connections as far as its own
// state goes: neither down, nor draining, nor held by an override. Weight is
// the snapshot's part of the rule (sched.Target.Up). A few atomic loads:
// the schedulers call it on every pick.
func (b *Backend) Takes() bool {
	return b.down.Load() == 0 && !b.draining.Load() && b.ovr.v.Load() == 0
}

// Condition is a backend's state as operators see it: the state, a short
// cause for the table, the full reason, and since when.
type Condition struct {
	State  State
	Cause  string    // short: "check", "passive", "resolve", "weight 0", "removed", "set drain", …; "" when up
	Reason string    // the whole story: "check failed 3 times: dial tcp …"
	Since  time.Time // when it entered this state; zero if unknown (up since it was created)
}

// Condition applies the availability rule for a backend whose configured
// weight is base: maint, then drain (removed from the configuration, or an
// override), then health (down, wrong role), then weight 0 (draining), else
// up. A backend that is up in this sense is one the schedulers may pick.
func (b *Backend) Condition(base int) Condition {
	o, by, osince := b.Override()
	switch {
	case o == Maint:
		return Condition{State: StateMaint, Cause: "set maint", Reason: "maint set by " + by, Since: osince}
	case b.draining.Load():
		c := Condition{State: StateDraining, Cause: "removed", Reason: "removed from the configuration", Since: b.drainSince()}
		return c
	case o == Drain:
		return Condition{State: StateDraining, Cause: "set drain", Reason: "drain set by " + by, Since: osince}
	}
	b.health.mu.Lock()
	bits, reason, since, cause := b.down.Load(), b.health.reason, b.health.since, b.health.cause
	b.health.mu.Unlock()
	if s := stateOf(bits); s != StateUp {
		return Condition{State: s, Cause: cause, Reason: reason, Since: since}
	}
	if base <= 0 {
		if n := b.zeroAt.Load(); n != 0 && time.Unix(0, n).After(since) {
			since = time.Unix(0, n) // the drain's own time, not when it last came up
		}
		return Condition{State: StateDraining, Cause: "weight 0", Reason: "weight 0 in the configuration", Since: since}
	}
	return Condition{State: StateUp, Reason: reason, Since: since}
}

// NoteWeight records the configured weight of a table just swapped in (at
// now): the first with weight 0 dates a drain by weight, which Condition
// shows as its since. Called by reload for every backend of each table.
func (b *Backend) NoteWeight(base int, now time.Time) {
	switch {
	case base > 0:
		b.zeroAt.Store(0)
	case b.zeroAt.Load() == 0:
		b.zeroAt.Store(now.UnixNano())
	}
}

// drainSince is when the current drain began; zero if unknown.
func (b *Backend) drainSince() time.Time {
	if n := b.drainAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}
