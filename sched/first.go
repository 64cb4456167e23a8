package sched

// firstSched is HAProxy's balance first: the first eligible target in list
// (file) order takes every new connection. It makes a single writer out of
// a list of database nodes: while the first is up, nothing reaches the
// others. With MaxConns set on the targets, a full one is passed over and
// connections spill to the next, as HAProxy's maxconn does; without it
// they never spill.
//
// Cursor: none. A rebuild changes nothing but the list.
type firstSched struct {
	ts []Target
}

var _ Picker = (*firstSched)(nil)

// newFirstSched builds first over ts.
func newFirstSched(ts []Target) *firstSched { return &firstSched{ts: ts} }

// Pick implements Picker.
func (s *firstSched) Pick(r *Request) (int, error) { return firstEligible(s.ts, r) }
