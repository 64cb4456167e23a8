package sched

import "math/rand/v2"

// MaxChoices bounds p2c's choices.
const MaxChoices = 16

// maxRounds bounds how many rounds of draws p2c makes before it scans.
const maxRounds = 4

// p2cSched is best-of-k ("power of two choices", Mitzenmacher; k = 2 by
// default): draw k targets at random, in proportion to their weights (from
// an alias table, with replacement), and take the one with the least
// active/weight, compared by cross-multiplication; ties keep the earlier
// draw (as IPVS twos and Envoy; HAProxy keeps the newer). Pick is O(k).
//
// Capacity: a draw that is not eligible (full at MaxConns, draining, tried)
// is never chosen. When all k draws of a round are ineligible it draws
// again, up to maxRounds rounds; then it scans all targets for the least
// loaded eligible one (as wlc does), so no connection is refused while
// capacity remains anywhere (Brooker's "best-of-k isn't magic": near
// saturation random draws rarely find the few free slots).
//
// Deviation from IPVS twos: draws are exactly weight-proportional, without
// twos' (w₁+1)/(S+1) bias towards the first dest.
type p2cSched struct {
	wr weightedRandom
	k  int
}

var _ Picker = (*p2cSched)(nil)

// newP2cSched builds p2c over ts with k draws per round; src is nil except in
// tests.
func newP2cSched(ts []Target, k int, src rand.Source) *p2cSched {
	return &p2cSched{wr: *newWeightedRandom(ts, src), k: k}
}

// Pick implements Picker.
func (s *p2cSched) Pick(r *Request) (int, error) {
	ts := s.wr.ts
	switch len(s.wr.col) {
	case 0:
		return -1, ErrNoBackend
	case 1:
		return firstEligible(ts, r)
	}
	for range maxRounds {
		best := -1
		for range s.k {
			best = better(ts, r, best, s.wr.draw())
		}
		if best >= 0 {
			return best, nil
		}
	}
	lc := leastConn{ts: ts, mode: modeWLC}
	return lc.Pick(r)
}

// better is p2c's rule for one draw: of the candidate best (−1 = none yet)
// and the drawn target i, the one with the least active/weight; an
// ineligible draw never wins, and a tie keeps the earlier draw.
func better(ts []Target, r *Request, best, i int) int {
	if !eligible(ts, i, r) {
		return best
	}
	if best < 0 || lighter(ts[i].B.Active(), int64(ts[i].Weight), ts[best].B.Active(), int64(ts[best].Weight)) {
		return i
	}
	return best
}
