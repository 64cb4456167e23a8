package sched

import "sync/atomic"

// roundRobin is LVS rr (ip_vs_rr.c): targets with weight > 0 in turn, in
// list order; other weights are ignored. Backends that are not eligible
// (draining, tried) are passed over, as LVS passes over overloaded ones.
//
// Cursor: one atomic counter. A rebuild continues after the backend the
// previous picker chose last, as LVS keeps its position when weights change;
// if that backend is gone it starts from the first.
type roundRobin struct {
	ts  []Target
	idx []int32 // indices of targets with weight > 0
	ctr atomic.Uint64
}

var _ Picker = (*roundRobin)(nil)

// newRoundRobin builds rr over ts; prev may be nil.
func newRoundRobin(ts []Target, prev Picker) *roundRobin {
	s := &roundRobin{ts: ts}
	for i, t := range ts {
		if t.Weight > 0 {
			s.idx = append(s.idx, int32(i))
		}
	}
	if p, ok := prev.(*roundRobin); ok && len(p.idx) > 0 {
		if c := p.ctr.Load(); c > 0 {
			last := p.ts[p.idx[(c-1)%uint64(len(p.idx))]].B
			for k, i := range s.idx {
				if ts[i].B == last {
					s.ctr.Store(uint64(k + 1))
					break
				}
			}
		}
	}
	return s
}

// Pick implements Picker.
func (s *roundRobin) Pick(r *Request) (int, error) {
	n := uint64(len(s.idx))
	for range n {
		i := int(s.idx[(s.ctr.Add(1)-1)%n])
		if eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return -1, ErrNoBackend
}
