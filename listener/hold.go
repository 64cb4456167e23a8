package listener

// What admission does for databases in a switchover: refuse while a
// primary service sees a split brain, fall back to another service's
// backends while none of the service's own is eligible, and hold a
// connection (hold_timeout) until a backend becomes eligible instead of
// closing it.

import (
	"errors"
	"fmt"
	"time"

	"fulcrum/sched"
)

// errSplitBrain: the service refuses while more than one backend claims
// the primary role and none is kept as the writer (split_brain =
// "refuse", or "newest" with a tie).
var errSplitBrain = fmt.Errorf("split brain: more than one backend claims the primary role (%w)", sched.ErrNoBackend)

// refusesSplitBrain reports whether svc turns new connections away now: a
// split brain with no writer kept (sched.Service.SplitWriter). The table
// says so; the policy has no part in it.
func refusesSplitBrain(svc *sched.Service) bool {
	return len(svc.SplitBrain) > 0 && svc.SplitWriter == ""
}

// pool returns the targets a connection picks from: the service's own,
// or its fallback's while none of its own is up (sched.Service.Serving).
func pool(svc *sched.Service) ([]sched.Target, sched.Picker) {
	if svc.Fallback == nil { // its own either way: no walk over its targets per connection
		return svc.Pool()
	}
	_, ts, p := svc.Serving()
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
// backend yet, so it waits in the service's hold queue, up to hold_timeout
// from its accept, and tries again each time it is woken with a backend
// eligible: by a new table (a check changed a state, a passive mark
// lapsed, a reload added a backend) or by any passing check of one of the
// service's backends (Server.Kick), since a node
// back within fall × interval never changes state and no table would
// wake it. It connects through the current table's service, which it
// leaves in in with its policy. The connection keeps the service slot it holds,
// so max_conns bounds the waiting too. A listener removed meanwhile ends
// the wait, and so does its client leaving (gone.go), which it looks for
// while it waits and before each redial.
//
// Its redials are not passive failures (tm.held): they are the same
// client trying the same nodes again at the pace of the checks, not new
// evidence, and counting them marked a node down that was coming back,
// adding rise × interval to its return. The first dial of every connection
// still counts, so new clients still mark a dead node down.
func (s *Server) connectHeld(in *inbound, ready func(int, *sched.Target) error) (bc int, t *sched.Target, err error) {
	a := in.adm
	a.hold.held.Add(1)
	in.tm.held, in.tm.waited = true, true
	deadline := in.start.Add(in.pol.HoldTimeout)
	tried := in.svc // the table (its service) the last connect failed in
	woke := false   // woken since that connect failed: a new table or a passing check
	for {
		in.tm.retries = 0 // a return but connect's has no failed dial to count
		h := a.join()
		viewAt := time.Now()
		snap := s.tbl.Load() // after join: a snapshot published, or a check passing, from here on kicks us
		cur := serviceAt(snap.Table, in.key, in.svc.Name)
		if cur == nil {
			h.leave()
			return -1, nil, sched.ErrNoBackend
		}
		curPol := snap.Policy(cur)
		// Wait while nothing is eligible, or until something happened
		// since the backends of this table just failed. A split brain
		// ends the wait at once.
		if (cur == tried && !woke || !eligibleNow(cur)) && !refusesSplitBrain(cur) {
			ok, gone := waitWatching(in.c, deadline, h.wait)
			h.leave()
			if gone {
				return -1, nil, errClientGone
			}
			if !ok {
				a.hold.expired.Add(1)
				return -1, nil, errHoldExpired
			}
			woke = true
			continue
		}
		h.leave()
		in.svc, in.pol, in.tm.viewAt = cur, curPol, viewAt
		if refusesSplitBrain(cur) {
			return -1, nil, errSplitBrain
		}
		*in.r = sched.Request{Client: in.r.Client} // a new table, or a backend that failed may be back
		bc, t, err := s.connect(in, ready, nil)
		if err == nil || errors.Is(err, errFull) || errors.Is(err, errClientGone) || time.Now().After(deadline) {
			return bc, t, err
		}
		tried, woke = cur, false
	}
}

// errHoldExpired: no backend became eligible within hold_timeout.
var errHoldExpired = fmt.Errorf("hold_timeout passed: %w", sched.ErrNoBackend)
