package health

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"fulcrum/backend"
)

// CheckSpec says how to run active checks on a backend.
type CheckSpec struct {
	Probe    Probe
	Interval time.Duration // between checks; jittered ±10%
	Rise     int           // consecutive successes to come up
	Fall     int           // consecutive failures to go down
	// Wake, when not nil, asks for a check at once (a Sentinel's failover
	// event: see WatchSentinel); the interval then restarts from it.
	Wake <-chan struct{}
	// Passed, when not nil, runs after each passing check: reload wakes
	// the service's held connections with it (listener.Server.Kick), since
	// a node back within fall × interval never changes state.
	Passed func()
}

// RunChecks probes b every Interval until ctx ends and hands each result
// to it (backend.Backend.Checked), which marks it down after Fall failures
// in a row and up after Rise successes in a row. A probe that failed for
// want of fulcrum's own resources (LocalError) counts as neither: it is
// shown as the last check and changes nothing. The first check comes after
// a random fraction of Interval, so that the checks of many backends do
// not align.
//
// A backend waiting for its first role check (AwaitRole) is probed at once.
func RunChecks(ctx context.Context, b *backend.Backend, spec CheckSpec) {
	defer b.SetLag(-1) // checks off: nothing measures it any more
	first := time.Duration(rand.Int64N(int64(spec.Interval)) + 1)
	if b.AwaitingRole() {
		first = time.Nanosecond
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-spec.Wake:
			t.Stop()
		}
		start := time.Now()
		a, err := spec.Probe.Ask(ctx)
		if ctx.Err() != nil {
			return // stopped mid-probe: the result means nothing
		}
		c := spec.Probe.result(start, a, err)
		b.Checked(c, spec.Rise, spec.Fall)
		if c.Err == nil && !c.Local && spec.Passed != nil {
			spec.Passed() // held connections try again: a node back within fall × interval never changed state
		}
		jitter := time.Duration(rand.Int64N(int64(spec.Interval)/5+1)) - spec.Interval/10
		t.Reset(spec.Interval + jitter)
	}
}

// result is the verdict on one probe that began at start (Ask's answer a
// and error err), as the backend takes it.
func (p *Probe) result(start time.Time, a Answer, err error) backend.Check {
	c := backend.Check{Start: start, Took: time.Since(start)}
	if LocalError(err) {
		// fulcrum's own want (descriptors, ports) says nothing about
		// the backend: neither a failure nor a pass, but in view.
		c.Err, c.Local = err, true
		return c
	}
	var wr *WrongRoleError
	c.Err = p.verdict(a.Role, err)
	c.WrongRole = errors.As(c.Err, &wr)
	c.Role, c.RoleWanted, c.Timeline = a.Role, p.roleWanted(), a.Timeline
	c.Lag, c.LagSet = a.Lag, a.LagSet
	return c
}
