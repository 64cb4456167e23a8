package sched

import "sync/atomic"

// weightedRoundRobin is LVS wrr (ip_vs_wrr.c), with its GCD stepping. The
// state is (cl, cw): the last dest picked and the current weight threshold.
// A pick walks the list from the dest after cl and takes the first with
// weight ≥ cw; at the end of the list cw drops by di, the gcd of the
// weights, and wraps to mw = max − (di − 1). So 8/6/4/2 gives
// A A B A B C A B C D, one period being Σw/gcd picks.
//
// The walk is periodic, so when the period is at most maxCycle picks the
// whole cycle is computed at build time and Pick is one atomic increment and
// an index: lock-free, exact under concurrency. Longer cycles (wide,
// irregular weights over many backends) use the walk itself, over a max
// segment tree (O(log n) per step) with the state in one CAS'd word. Both
// give the same sequence; a test holds them to it.
//
// An ineligible target (draining, tried) is passed over as LVS passes over an
// overloaded dest: the cursor moves on past it. After 2n+2 such skips in a
// row the first eligible target in list order is taken instead, so a pick is
// bounded even when one heavy backend fills a long stretch of the cycle.
//
// Cursor: a rebuild starts a fresh cycle, as LVS init_svc does (cl = head,
// cw = mw). reload reuses the picker, and so the cursor, when a service's
// targets are unchanged.
type weightedRoundRobin struct {
	ts    []Target
	di    int      // gcd of the positive weights
	mw    int      // max weight − (di − 1); 0 when every weight is 0
	skips int      // how many cycle slots a pick may pass over
	seq   sequence // the cycle, when it is short enough to keep

	tree  maxTree
	state atomic.Uint64 // walk state when cycle is nil: (cl+1)<<32 | cw
}

var _ Picker = (*weightedRoundRobin)(nil)

const (
	maxCycle     = 1 << 20 // longest cycle kept as a table: 4 MiB
	maxCycleWork = 1 << 23 // passes × targets spent building it
)

// newWeightedRoundRobin builds wrr over ts. prev is accepted for symmetry
// with the other schedulers; wrr restarts its cycle (see the type).
func newWeightedRoundRobin(ts []Target, prev Picker) *weightedRoundRobin {
	s := &weightedRoundRobin{ts: ts}
	w := make([]int, len(ts))
	maxW, sum, npos := 0, 0, 0
	for i, t := range ts {
		w[i] = t.Weight
		if t.Weight > 0 {
			s.di = gcd(s.di, t.Weight)
			maxW = max(maxW, t.Weight)
			sum += t.Weight
			npos++
		}
	}
	if maxW == 0 {
		return s // Pick always fails
	}
	s.mw = maxW - (s.di - 1)
	s.skips = 2*npos + 2
	period, passes := sum/s.di, maxW/s.di
	if period <= maxCycle && passes*len(ts) <= maxCycleWork {
		s.seq.loop = make([]int32, 0, period)
		for cw := s.mw; cw > 0; cw -= s.di {
			for i, wi := range w {
				if wi >= cw {
					s.seq.loop = append(s.seq.loop, int32(i))
				}
			}
		}
		return s
	}
	s.tree = newMaxTree(w)
	s.state.Store(uint64(s.mw)) // cl = head, cw = mw
	return s
}

// Pick implements Picker.
func (s *weightedRoundRobin) Pick(r *Request) (int, error) {
	if s.mw == 0 {
		return -1, ErrNoBackend
	}
	if s.seq.loop == nil {
		return s.walk(r)
	}
	return s.seq.pick(s.ts, r, s.skips)
}

// walk is ip_vs_wrr_schedule over the segment tree.
func (s *weightedRoundRobin) walk(r *Request) (int, error) {
	for {
		old := s.state.Load()
		cl, cw := int(old>>32)-1, int(uint32(old))
		pick := -1
		for range s.skips {
			j := s.tree.first(cl+1, cw)
			for j < 0 { // end of the list: next pass
				cl, cw = -1, cw-s.di
				if cw <= 0 {
					cw = s.mw
				}
				j = s.tree.first(0, cw)
			}
			cl = j
			if eligible(s.ts, j, r) {
				pick = j
				break
			}
		}
		if s.state.CompareAndSwap(old, uint64(cl+1)<<32|uint64(cw)) {
			if pick < 0 {
				return firstEligible(s.ts, r)
			}
			return pick, nil
		}
	}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// maxTree is a segment tree of maxima over a fixed []int.
type maxTree struct {
	size int     // leaves, a power of two
	t    []int32 // t[1] is the root; leaf i is t[size+i]
}

func newMaxTree(w []int) maxTree {
	size := 1
	for size < len(w) {
		size *= 2
	}
	m := maxTree{size: size, t: make([]int32, 2*size)}
	for i, v := range w {
		m.t[size+i] = int32(v)
	}
	for i := size - 1; i > 0; i-- {
		m.t[i] = max(m.t[2*i], m.t[2*i+1])
	}
	return m
}

// first returns the smallest index ≥ lo whose value is ≥ x, or -1.
func (m *maxTree) first(lo, x int) int {
	return m.find(1, 0, m.size, lo, int32(x))
}

func (m *maxTree) find(node, nl, nr, lo int, x int32) int {
	if nr <= lo || m.t[node] < x {
		return -1
	}
	if nr-nl == 1 {
		return nl
	}
	mid := (nl + nr) / 2
	if i := m.find(2*node, nl, mid, lo, x); i >= 0 {
		return i
	}
	return m.find(2*node+1, mid, nr, lo, x)
}
