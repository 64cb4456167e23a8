package sched

import (
	"slices"
	"sync"

	"fulcrum/backend"
)

// smoothWeightedRoundRobin is nginx's smooth weighted round robin
// (ngx_http_upstream_get_peer): each peer has a current weight; a pick adds
// every peer's weight to its current weight, takes the peer with the
// greatest (ties to the earliest in list order) and subtracts the total
// weight from it. 5/1/1 gives A A B A C A A rather than wrr's A A A A A B C.
// Targets with weight 0 take no part.
//
// Two forms give the same sequence; a test holds them to it.
//
//   - Sequence form: the state machine is run at build time until its state
//     repeats. Started from zero it is periodic with period Σw/gcd from the
//     first pick; started from carried-over current weights it reaches a
//     period of that length after a short transient (a few dozen picks in
//     our measurements). Both are stored, and Pick is one atomic increment
//     and an index, lock-free and exact under concurrency.
//   - State-machine form, used when building the sequence would cost more
//     than maxCycleWork steps×peers (large, irregular weight sets) or the
//     transient does not end within one period: the nginx loop itself under
//     a mutex, O(n) per pick.
//
// Ineligible targets (draining, full, tried) are passed over as in wrr: the
// sequence moves on past their slot, so the others keep their order. This
// differs from nginx, which skips a down peer without touching its current
// weight; nginx's effective_weight (slow recovery after failures) has no
// counterpart here: health is handled by eligible().
//
// Cursor: a rebuild carries the current weights of the backends it keeps
// (matched by *backend.Backend) from prev, read at its latest pick; new
// backends start at 0. nginx resets all of them on reload; carrying them
// means a backend picked just before a reload is not picked again at once.
type smoothWeightedRoundRobin struct {
	ts    []Target
	peers []int32 // targets with weight > 0, in list order
	w     []int64 // their weights
	total int64
	skips int

	seq   sequence
	start []int64 // current weights before seq's first slot
	loop0 []int64 // current weights before seq.loop's first slot

	mu  sync.Mutex // protects cur; nil cur means the sequence form
	cur []int64
}

var _ Picker = (*smoothWeightedRoundRobin)(nil)

// newSmoothWeightedRoundRobin builds swrr over ts; prev may be nil.
func newSmoothWeightedRoundRobin(ts []Target, prev Picker) *smoothWeightedRoundRobin {
	s := &smoothWeightedRoundRobin{ts: ts}
	g := 0
	for i, t := range ts {
		if t.Weight > 0 {
			s.peers = append(s.peers, int32(i))
			s.w = append(s.w, int64(t.Weight))
			s.total += int64(t.Weight)
			g = gcd(g, t.Weight)
		}
	}
	n := len(s.peers)
	if n == 0 {
		return s
	}
	s.skips = 2*n + 2
	s.start = make([]int64, n)
	if p, ok := prev.(*smoothWeightedRoundRobin); ok {
		carried := p.current()
		for k, i := range s.peers {
			s.start[k] = carried[ts[i].B]
		}
	}
	period := int(s.total) / g
	if period > maxCycle || 3*period*n > maxCycleWork || !s.buildSequence(period) {
		s.cur = slices.Clone(s.start)
	}
	return s
}

// step runs one round of the nginx loop on c and returns the peer chosen.
func (s *smoothWeightedRoundRobin) step(c []int64) int {
	best := 0
	for k := range c {
		c[k] += s.w[k]
		if c[k] > c[best] {
			best = k
		}
	}
	c[best] -= s.total
	return best
}

// buildSequence finds t, the first pick from which the state repeats every
// period picks, by running two copies of the state machine period picks
// apart. It gives up (false) if t would exceed one period.
func (s *smoothWeightedRoundRobin) buildSequence(period int) bool {
	a, b := slices.Clone(s.start), slices.Clone(s.start)
	picks := make([]int32, 0, 2*period)
	for range period {
		picks = append(picks, s.peers[s.step(b)])
	}
	for t := 0; ; t++ {
		if slices.Equal(a, b) {
			s.seq.prefix = picks[:t:t]
			s.seq.loop = picks[t : t+period]
			s.loop0 = a
			return true
		}
		if t == period {
			return false
		}
		s.step(a)
		picks = append(picks, s.peers[s.step(b)])
	}
}

// Pick implements Picker.
func (s *smoothWeightedRoundRobin) Pick(r *Request) (int, error) {
	switch {
	case len(s.peers) == 0:
		return -1, ErrNoBackend
	case len(s.peers) == 1: // nginx's peers->single: no arithmetic
		if i := int(s.peers[0]); eligible(s.ts, i, r) {
			return i, nil
		}
		return -1, ErrNoBackend
	case s.cur == nil:
		return s.seq.pick(s.ts, r, s.skips)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for range s.skips {
		i := int(s.peers[s.step(s.cur)])
		if eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return firstEligible(s.ts, r)
}

// current returns each peer's current weight as of the latest pick, keyed by
// backend, for the next build to carry over.
func (s *smoothWeightedRoundRobin) current() map[*backend.Backend]int64 {
	out := make(map[*backend.Backend]int64, len(s.peers))
	if len(s.peers) == 0 {
		return out
	}
	var c []int64
	if s.cur != nil {
		s.mu.Lock()
		c = slices.Clone(s.cur)
		s.mu.Unlock()
	} else {
		c = s.seqState(s.seq.ctr.Load())
	}
	for k, i := range s.peers {
		out[s.ts[i].B] = c[k]
	}
	return out
}

// seqState is the current-weight vector after k picks of the sequence form:
// the base state plus j rounds of weights, minus the total for each pick.
func (s *smoothWeightedRoundRobin) seqState(k uint64) []int64 {
	base, slots := s.start, s.seq.prefix
	if p := uint64(len(s.seq.prefix)); k >= p {
		base, slots = s.loop0, s.seq.loop[:(k-p)%uint64(len(s.seq.loop))]
	} else {
		slots = slots[:k]
	}
	pos := make(map[int32]int, len(s.peers)) // target index → peer index
	for k, i := range s.peers {
		pos[i] = k
	}
	c := slices.Clone(base)
	for k := range c {
		c[k] += int64(len(slots)) * s.w[k]
	}
	for _, i := range slots {
		c[pos[i]] -= s.total
	}
	return c
}
