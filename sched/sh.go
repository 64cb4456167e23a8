package sched

import "net/netip"

// sourceHash is LVS sh (ip_vs_sh.c): a table of buckets, each owned by a
// target, indexed by a hash of the client address (and port, with hash_key
// "ip_port"). The same client reaches the same backend for as long as the
// backend set is unchanged; a change reassigns buckets wholesale (sh is not
// consistent hashing: use mh for that). O(1) pick, O(buckets) memory.
//
// The table is LVS's: the targets, in list order and cyclically, each take
// weight consecutive buckets (a weight-0 target still takes one per round,
// so draining a backend by weight 0 moves no other client); the hash is
// hash_32(port + addr, bits) with the golden-ratio multiplier, IPv6
// addresses folded by XOR of their four words. A bucket whose target is not
// eligible falls back as LVS's sh-fallback flag does: buckets
// (offset + 2·hash) for offset = 0, 1, …
//
// Deliberate differences from LVS, which has 256 buckets: weights are first
// divided by their gcd, and the table grows past 256 buckets (2^8 to 2^20)
// until it holds at least 8 rounds of weights, so that large weights and
// many backends keep their proportions. With small weight sums it is exactly
// LVS's table. The fallback probes at most 256 buckets, then takes the first
// eligible target after hash mod n in list order.
type sourceHash struct {
	ts       []Target
	bits     uint
	buckets  []int32
	withPort bool
}

var _ Picker = (*sourceHash)(nil)

const (
	shMinBits = 8 // LVS's IP_VS_SH_TAB_BITS
	shMaxBits = 20
	shProbes  = 256
)

// newSourceHash builds sh over ts; withPort adds the client port to the key.
func newSourceHash(ts []Target, withPort bool) *sourceHash {
	s := &sourceHash{ts: ts, bits: shMinBits, withPort: withPort}
	if len(ts) == 0 {
		return s
	}
	g := 0
	for _, t := range ts {
		g = gcd(g, max(t.Weight, 0))
	}
	g = max(g, 1)
	turns := make([]int, len(ts))
	round := 0
	for i, t := range ts {
		turns[i] = max(t.Weight/g, 1)
		round += turns[i]
	}
	for s.bits < shMaxBits && 1<<s.bits < 8*round {
		s.bits++
	}
	s.buckets = make([]int32, 1<<s.bits)
	for b := 0; b < len(s.buckets); {
		for i, n := range turns {
			n = min(n, len(s.buckets)-b)
			for k := range n {
				s.buckets[b+k] = int32(i)
			}
			b += n
		}
	}
	return s
}

// hash is ip_vs_sh_hashkey with offset 0.
func (s *sourceHash) hash(c netip.AddrPort) uint32 {
	a := c.Addr().Unmap()
	var fold uint32
	if a.Is4() {
		b := a.As4()
		fold = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	} else {
		b := a.As16()
		for k := 0; k < 16; k += 4 {
			fold ^= uint32(b[k])<<24 | uint32(b[k+1])<<16 | uint32(b[k+2])<<8 | uint32(b[k+3])
		}
	}
	if s.withPort {
		fold += uint32(c.Port())
	}
	return (fold * 0x61C88647) >> (32 - s.bits)
}

// Pick implements Picker.
func (s *sourceHash) Pick(r *Request) (int, error) {
	if s.buckets == nil {
		return -1, ErrNoBackend
	}
	h := s.hash(r.Client)
	if i := int(s.buckets[h]); eligible(s.ts, i, r) {
		return i, nil
	}
	mask := uint32(len(s.buckets) - 1)
	for off := range uint32(shProbes) {
		if i := int(s.buckets[(off+2*h)&mask]); eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return eligibleFrom(s.ts, r, int(h%uint32(len(s.ts))))
}

// eligibleFrom is the last resort of the hashing schedulers: the first
// eligible target at or after start in list order, wrapping around, so the
// choice still depends only on the key.
func eligibleFrom(ts []Target, r *Request, start int) (int, error) {
	for k := range ts {
		if i := (start + k) % len(ts); eligible(ts, i, r) {
			return i, nil
		}
	}
	return -1, ErrNoBackend
}
