package sched

import "sync/atomic"

// sequence is a pick order computed at build time: prefix once, then loop
// over and over. One atomic counter advances it, so a pick is lock-free and
// concurrent pickers still follow the order exactly: the k-th pick overall
// gets slot k. wrr and swrr use it when their period is short enough.
type sequence struct {
	prefix []int32 // target indices taken once, before the loop
	loop   []int32 // target indices repeated forever; empty = no sequence
	ctr    atomic.Uint64
}

// at is the target of slot k.
func (q *sequence) at(k uint64) int32 {
	if p := uint64(len(q.prefix)); k < p {
		return q.prefix[k]
	} else {
		k -= p
	}
	return q.loop[k%uint64(len(q.loop))]
}

// pick takes the next slot whose target is eligible. An ineligible target's
// slot is passed over (the cursor moves on, as LVS passes over an
// overloaded dest); after skips of them in a row it falls back to the first
// eligible target in list order, so a pick is bounded even when one heavy
// backend fills a long stretch of the sequence.
func (q *sequence) pick(ts []Target, r *Request, skips int) (int, error) {
	for range skips {
		i := int(q.at(q.ctr.Add(1) - 1))
		if eligible(ts, i, r) {
			return i, nil
		}
	}
	return firstEligible(ts, r)
}
