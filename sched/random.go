package sched

import (
	"math"
	"math/rand/v2"
)

// maxDraws bounds the draws random, wrandom and p2c make before they fall
// back to a scan. Rejection then an exact fallback keeps the distribution
// exact over the eligible targets: each stage is.
const maxDraws = 8

// dice draws random numbers: the runtime's per-thread generator (no lock,
// no allocation) unless a test supplied a seeded source.
type dice struct{ r *rand.Rand }

func newDice(src rand.Source) dice {
	if src == nil {
		return dice{}
	}
	return dice{rand.New(src)}
}

// below returns a uniform number in [0, n); n > 0.
func (d dice) below(n uint64) uint64 {
	if d.r == nil {
		return rand.Uint64N(n)
	}
	return d.r.Uint64N(n)
}

func (d dice) uint64() uint64 {
	if d.r == nil {
		return rand.Uint64()
	}
	return d.r.Uint64()
}

// pair returns independent uniform numbers in [0, n) and [0, m), exactly,
// from a single 64-bit draw when both bounds fit in 32 bits (the alias
// method's column and coin): the halves of a uniform word are independent,
// and Lemire's method turns each into an exact bounded number, redrawing
// only that half in the rare rejected case.
func (d dice) pair(n, m uint64) (uint64, uint64) {
	if n > math.MaxUint32 || m > math.MaxUint32 {
		return d.below(n), d.below(m)
	}
	x := d.uint64()
	return d.lemire(uint32(x>>32), uint32(n)), d.lemire(uint32(x), uint32(m))
}

// lemire maps a uniform x to [0, n) without bias (Lemire 2019).
func (d dice) lemire(x, n uint32) uint64 {
	p := uint64(x) * uint64(n)
	if uint32(p) < n {
		for thresh := -n % n; uint32(p) < thresh; {
			p = uint64(uint32(d.uint64())) * uint64(n)
		}
	}
	return p >> 32
}

// randomSched picks uniformly among the targets with weight > 0; their weights
// are otherwise ignored. A drawn target that is not eligible is drawn again
// (at most maxDraws times), then one uniform draw among all eligible targets
// is made by scanning: O(1) expected, O(n) worst case.
type randomSched struct {
	ts   []Target
	idx  []int32 // targets with weight > 0
	dice dice

	col   []aliasCol // wrandom's alias table; nil for random
	total uint64     // Σw, wrandom only
}

var _ Picker = (*randomSched)(nil)

// newRandomSched builds random over ts; src is nil except in tests.
func newRandomSched(ts []Target, src rand.Source) *randomSched {
	s := &randomSched{ts: ts, dice: newDice(src)}
	for i, t := range ts {
		if t.Weight > 0 {
			s.idx = append(s.idx, int32(i))
		}
	}
	return s
}

// Pick implements Picker; it serves random and wrandom alike.
func (s *randomSched) Pick(r *Request) (int, error) {
	switch len(s.idx) {
	case 0:
		return -1, ErrNoBackend
	case 1:
		return firstEligible(s.ts, r)
	}
	for range maxDraws {
		if i := s.draw(); eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return s.scan(r)
}

// draw is one draw: uniform over idx, or by the alias table.
func (s *randomSched) draw() int {
	if s.col == nil {
		return int(s.idx[s.dice.below(uint64(len(s.idx)))])
	}
	j, u := s.dice.pair(uint64(len(s.col)), s.total)
	c := &s.col[j]
	if u < c.prob {
		return int(c.own)
	}
	return int(c.alias)
}

// weight is target i's weight in the draw.
func (s *randomSched) weight(i int) uint64 {
	if s.col == nil {
		return 1
	}
	return uint64(s.ts[i].Weight)
}

// scan draws among the eligible targets of idx, each with its weight, by
// two passes: sum, draw, find. One eligible target is returned without a
// draw.
func (s *randomSched) scan(r *Request) (int, error) {
	var sum uint64
	last := -1
	for _, i := range s.idx {
		if eligible(s.ts, int(i), r) {
			sum += s.weight(int(i))
			last = int(i)
		}
	}
	if last < 0 {
		return -1, ErrNoBackend
	}
	if sum == s.weight(last) {
		return last, nil
	}
	x := s.dice.below(sum)
	for _, i := range s.idx {
		if eligible(s.ts, int(i), r) {
			if wi := s.weight(int(i)); x < wi {
				return int(i), nil
			} else {
				x -= wi
			}
		}
	}
	return last, nil // eligibility changed between the passes
}

// weightedRandom picks target i with probability w_i/Σw, exactly, in O(1):
// Vose's alias method in integer form. Build is O(n) and memory O(n),
// independent of the weights' size: one (probability, alias) pair per
// target. A pick is two draws: a column j uniform in [0, n), and u uniform
// in [0, Σw); it takes j if u < prob[j], else alias[j]. Over all (j, u)
// pairs target i comes out exactly w_i·n times.
//
// Ineligible targets are handled as in Random: redraw, then an exact
// weighted draw among the eligible ones by scanning.
type weightedRandom struct {
	randomSched // with its alias table
}

// aliasCol is one column of the alias table; target indices, not positions.
type aliasCol struct {
	prob  uint64 // take own with u < prob, u uniform in [0, total)
	own   int32
	alias int32
}

var _ Picker = (*weightedRandom)(nil)

// newWeightedRandom builds wrandom over ts; src is nil except in tests.
func newWeightedRandom(ts []Target, src rand.Source) *weightedRandom {
	s := &weightedRandom{randomSched: *newRandomSched(ts, src)}
	n := uint64(len(s.idx))
	if n == 0 {
		return s
	}
	scaled := make([]uint64, n) // w_i·n, against total
	for k, i := range s.idx {
		scaled[k] = uint64(ts[i].Weight) * n
		s.total += uint64(ts[i].Weight)
	}
	s.col = make([]aliasCol, n)
	var small, large []int // FIFO queues in index order, as in the vectors
	for k, v := range scaled {
		s.col[k] = aliasCol{prob: s.total, own: s.idx[k], alias: s.idx[k]}
		if v < s.total {
			small = append(small, k)
		} else {
			large = append(large, k)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		l, g := small[0], large[0]
		small, large = small[1:], large[1:]
		s.col[l].prob, s.col[l].alias = scaled[l], s.idx[g]
		scaled[g] -= s.total - scaled[l]
		if scaled[g] < s.total {
			small = append(small, g)
		} else {
			large = append(large, g)
		}
	}
	return s // what is left in either queue keeps prob = total
}
