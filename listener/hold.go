package listener

// What admission does for databases in a switchover: refuse while a
// primary service sees a split brain, fall back to another service's
// backends while none of the service's own is eligible, and hold a
// connection (hold_timeout) until a backend becomes eligible instead of
// closing it.

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"fulcrum/sched"
)

// errSplitBrain: the service refuses while more than one backend claims
// the primary role (split_brain = "refuse").
var errSplitBrain = fmt.Errorf("split brain: more than one backend claims the primary role (%w)", sched.ErrNoBackend)

// refusesSplitBrain reports whether svc, of policy pol, turns new
// connections away now.
func refusesSplitBrain(svc *sched.Service, pol *Policy) bool {
	return pol.RefuseSplitBrain && len(svc.SplitBrain) > 0
}

// maxFallbacks bounds a chain of fallbacks (conf refuses cycles).
const maxFallbacks = 8

// pool returns the targets a connection picks from: the service's own (see
// sched.Service.Pool), or, while none of them is up, those of its fallback
// service, following the chain. Fullness does not fall back: a full pool
// queues instead.
func pool(svc *sched.Service) ([]sched.Target, sched.Picker) {
	ts, p := svc.Pool()
	if svc.Fallback == nil {
		return ts, p
	}
	var none sched.Request
	if up(ts, &none) {
		return ts, p
	}
	for f, n := svc.Fallback, 0; f != nil && n < maxFallbacks; f, n = f.Fallback, n+1 {
		if fts, fp := f.Pool(); up(fts, &none) {
			return fts, fp
		}
	}
	return ts, p
}

// eligibleNow reports whether a connection to svc could be dialled now:
// some backend of its pool (or its fallback's) is up.
func eligibleNow(svc *sched.Service) bool {
	var none sched.Request
	ts, _ := pool(svc)
	return up(ts, &none)
}

// connectHeld is connect for a service with hold_timeout once connect found
// no eligible backend, or dialled every one it could and failed (a node
// that just died, before its checks say so): nothing has been sent to a
// backend yet, so it waits in the service's hold queue for a table in which
// a backend is eligible (a check passed, a passive mark, a reload added
// one), up to hold_timeout from start, then connects through that table's
// service, which it returns with its policy. The connection keeps the service slot it
// holds, so max_conns bounds the waiting too. A listener removed meanwhile
// ends the wait.
func (s *Server) connectHeld(key netip.AddrPort, svc *sched.Service, pol *Policy, r *sched.Request, ready func(int, *sched.Target) error, start time.Time, tm *timing) (int, *sched.Target, int, error, *sched.Service, *Policy) {
	g := svc.Group
	g.HoldBegan()
	deadline := start.Add(pol.HoldTimeout)
	tried := svc // the table (its service) the last connect failed in
	for {
		h := g.Hold()
		snap := s.tbl.Load() // after Hold: a table swapped in from here on kicks us
		cur := serviceAt(snap.Table, key, svc.Name)
		if cur == nil {
			h.Leave()
			return -1, nil, 0, sched.ErrNoBackend, svc, pol
		}
		curPol := snap.Policy(cur)
		// Wait while nothing is eligible, or while the table is the one
		// whose backends just failed. A split brain ends the wait at once.
		if (cur == tried || !eligibleNow(cur)) && !refusesSplitBrain(cur, curPol) {
			ok := h.Wait(deadline)
			h.Leave()
			if !ok {
				g.HoldExpired()
				return -1, nil, 0, errHoldExpired, svc, pol
			}
			continue
		}
		h.Leave()
		svc, pol = cur, curPol
		if refusesSplitBrain(svc, pol) {
			return -1, nil, 0, errSplitBrain, svc, pol
		}
		*r = sched.Request{Client: r.Client} // a new table: new indices, and a backend that failed may be back
		bc, t, tries, err := s.connect(svc, pol, r, ready, start, tm, nil)
		if err == nil || errors.Is(err, errFull) || time.Now().After(deadline) {
			return bc, t, tries, err, svc, pol
		}
		tried = svc
	}
}

// errHoldExpired: no backend became eligible within hold_timeout.
var errHoldExpired = fmt.Errorf("hold_timeout passed: %w", sched.ErrNoBackend)
