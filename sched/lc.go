package sched

// LeastConn is LVS lc (ip_vs_lc.c): the eligible target with the fewest
// active connections; ties go to the first in list order. Weights matter only
// as 0 (excluded) or not. A proxy has no "inactive" connections in the LVS
// sense, so the LVS overhead (active·256 + inactive) is just the active count.
//
// Pick scans every target: O(n). It holds no state of its own.
type LeastConn struct {
	ts []Target
}

var _ Picker = (*LeastConn)(nil)

// NewLeastConn builds lc over ts.
func NewLeastConn(ts []Target) *LeastConn { return &LeastConn{ts: ts} }

// Pick implements Picker.
func (s *LeastConn) Pick(r *Request) (int, error) {
	best, least := -1, int64(0)
	for i := range s.ts {
		if !eligible(s.ts, i, r) {
			continue
		}
		if a := s.ts[i].B.Active(); best < 0 || a < least {
			best, least = i, a
		}
	}
	if best < 0 {
		return -1, ErrNoBackend
	}
	return best, nil
}
