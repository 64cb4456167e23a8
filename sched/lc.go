package sched

// The least-connection family (LVS lc, wlc, sed, nq) reads each target's
// active count, an atomic, and holds no state of its own: Pick scans every
// target, O(n), with no lock. Counts read during the scan may be slightly
// stale under concurrency, as in LVS. A proxy has no "inactive" connections
// in the LVS sense, so LVS's overhead (active·256 + inactive) is the active
// count here; ratios are unchanged. Above a few hundred backends p2c is the
// O(1) alternative.
//
// Loads are compared by cross-multiplication in int64, never divided:
// a/wa < b/wb ⇔ a·wb < b·wa. With weights ≤ 65535 the products overflow
// only past 2^47 connections.

// lcMode selects the member of the family.
type lcMode uint8

const (
	modeLC  lcMode = iota // fewest active; weights only as 0 or not
	modeWLC               // least active/weight
	modeSED               // least (active+1)/weight
	modeNQ                // the first idle target, else as sed
)

// leastConn is the shared scan.
type leastConn struct {
	ts   []Target
	mode lcMode
}

// leastConnSched is LVS lc (ip_vs_lc.c): the eligible target with the fewest
// active connections; ties go to the first in list order.
type leastConnSched struct{ leastConn }

// weightedLeastConn is LVS wlc (ip_vs_wlc.c): the least active/weight; ties
// keep the earlier target. When all are idle the first wins, whatever the
// weights.
type weightedLeastConn struct{ leastConn }

// shortestExpectedDelay is LVS sed (ip_vs_sed.c): the least
// (active+1)/weight, so a heavier backend wins even when all are idle.
type shortestExpectedDelay struct{ leastConn }

// neverQueue is LVS nq (ip_vs_nq.c): the first idle target in list order;
// if none is idle, as sed.
type neverQueue struct{ leastConn }

var (
	_ Picker = (*leastConnSched)(nil)
	_ Picker = (*weightedLeastConn)(nil)
	_ Picker = (*shortestExpectedDelay)(nil)
	_ Picker = (*neverQueue)(nil)
)

// newLeastConnSched builds lc over ts.
func newLeastConnSched(ts []Target) *leastConnSched { return &leastConnSched{leastConn{ts, modeLC}} }

// newWeightedLeastConn builds wlc over ts.
func newWeightedLeastConn(ts []Target) *weightedLeastConn {
	return &weightedLeastConn{leastConn{ts, modeWLC}}
}

// newShortestExpectedDelay builds sed over ts.
func newShortestExpectedDelay(ts []Target) *shortestExpectedDelay {
	return &shortestExpectedDelay{leastConn{ts, modeSED}}
}

// newNeverQueue builds nq over ts.
func newNeverQueue(ts []Target) *neverQueue { return &neverQueue{leastConn{ts, modeNQ}} }

// Pick implements Picker.
func (s *leastConn) Pick(r *Request) (int, error) {
	best := -1
	var bo, bw int64 // the best target's overhead and weight
	for i := range s.ts {
		if !eligible(s.ts, i, r) {
			continue
		}
		a := s.ts[i].B.Active()
		if s.mode == modeNQ && a == 0 {
			return i, nil
		}
		o, w := s.overhead(a), int64(s.ts[i].Weight)
		if s.mode == modeLC {
			w = 1
		}
		if best < 0 || lighter(o, w, bo, bw) {
			best, bo, bw = i, o, w
		}
	}
	if best < 0 {
		return -1, ErrNoBackend
	}
	return best, nil
}

func (s *leastConn) overhead(active int64) int64 {
	if s.mode == modeSED || s.mode == modeNQ {
		return active + 1
	}
	return active
}

// lighter is LVS's replacement test: o/w < bo/bw, as bo·w > o·bw. Strict,
// so ties keep the earlier target. lc compares o alone (weights as 1).
func lighter(o, w, bo, bw int64) bool {
	return bo*w > o*bw
}
