package sched

// firstSched is HAProxy's balance first: the first eligible target in list
// (file) order takes every new connection. It makes a single writer out of
// a list of database nodes: while the first is up, nothing reaches the
// others. With MaxConns set on the targets, a full one is passed over and
// connections spill to the next, as HAProxy's maxconn does; without it
// they never spill.
//
// With a writer (Options.Writer, failback), the writer's target comes
// before the list: it takes every new connection while it is eligible,
// and only then does the list order apply, so that a writer that fails
// between two rebuilds is passed over at once. Who the writer is, is not
// the picker's business: reload decides it (failback) and builds a new
// picker when it changes.
//
// Cursor: none. A rebuild changes nothing but the list and the writer.
type firstSched struct {
	ts     []Target
	writer int // index of Options.Writer's target; -1: none
}

var _ Picker = (*firstSched)(nil)

// newFirstSched builds first over ts, with writer (a backend name, "" for
// none) ahead of the list.
func newFirstSched(ts []Target, writer string) *firstSched {
	s := &firstSched{ts: ts, writer: -1}
	if writer != "" {
		for i := range ts {
			if ts[i].B.Name == writer {
				s.writer = i
				break
			}
		}
	}
	return s
}

// Pick implements Picker.
func (s *firstSched) Pick(r *Request) (int, error) {
	if s.writer >= 0 && eligible(s.ts, s.writer, r) {
		return s.writer, nil
	}
	return firstEligible(s.ts, r)
}
