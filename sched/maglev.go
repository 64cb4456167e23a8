package sched

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"net/netip"
)

// maglevSched is Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4;
// LVS ip_vs_mh.c): a lookup table of M slots (M prime), filled by letting
// the backends take turns claiming their next preferred empty slot. Backend
// i prefers slots offset_i, offset_i + skip_i, … (mod M), with
// offset_i = h(0, name) mod M and skip_i = h(1, name) mod (M−1) + 1, where
// h(seed, s) is FNV-1a-64 over the little-endian seed then s. Pick hashes
// the client and reads one slot: O(1); memory M·4 bytes; build about
// M·ln M probes.
//
// Deterministic by design: no random seed, so every fulcrum instance with
// the same configuration builds the same table and sends a client to the
// same backend. The table depends on the backend names (identity) and their
// order in the file, and on M. Removing one of N backends moves about 1/N of
// the slots plus a little; each backend owns close to M/N slots.
//
// Weights follow LVS mh: per round backend i takes turns_i = (w_i/gcd) >>
// shift consecutive claims (at least 1), shift = max(0, bits(max w/gcd) − 6),
// so weights act with 6 bits of precision and the fill stays balanced.
// Weight 0 backends own no slot.
//
// A slot whose backend is not eligible falls back to the following slots
// (up to mhProbes), then to the first eligible backend after hash mod n:
// deterministic, and it spreads that backend's clients over the others in
// proportion to their slots. The client hash is a 64-bit mix of the address
// (IPv4-mapped IPv6 folded to IPv4) and, with hash_key "ip_port", the port.
type maglevSched struct {
	ts       []Target
	m        uint64
	mhi, mlo uint64  // ⌈2^128/m⌉, so slot needs no division
	table    []int32 // slot → target index; nil when no target has weight
	withPort bool
}

var _ Picker = (*maglevSched)(nil)

const mhProbes = 32

// newMaglevSched builds mh over ts with a table of m slots; m must be a prime
// larger than len(ts) and at most MaxTableSize.
func newMaglevSched(ts []Target, m int, withPort bool) (*maglevSched, error) {
	if m > MaxTableSize || !isPrime(m) || m <= len(ts) {
		return nil, fmt.Errorf("mh table size %d is not a prime between %d and %d", m, len(ts)+1, MaxTableSize)
	}
	s := &maglevSched{ts: ts, m: uint64(m), withPort: withPort}
	s.mhi, s.mlo = reciprocal(s.m)
	idx := make([]int32, 0, len(ts))
	offset, skip := make([]uint64, 0, len(ts)), make([]uint64, 0, len(ts))
	turns := make([]int, 0, len(ts))
	g, maxW := 0, 0
	for _, t := range ts {
		if t.Weight > 0 {
			g, maxW = gcd(g, t.Weight), max(maxW, t.Weight)
		}
	}
	shift := 0
	for b := maxW / max(g, 1); b>>shift >= 1<<6; {
		shift++
	}
	for i, t := range ts {
		if t.Weight <= 0 {
			continue
		}
		idx = append(idx, int32(i))
		offset = append(offset, fnvSeed(0, t.B.Name)%s.m)
		skip = append(skip, fnvSeed(1, t.B.Name)%(s.m-1)+1)
		turns = append(turns, max((t.Weight/g)>>shift, 1))
	}
	if len(idx) == 0 {
		return s, nil
	}
	s.table = populate(m, offset, skip, turns)
	for j, k := range s.table {
		s.table[j] = idx[k]
	}
	return s, nil
}

// populate is Maglev's Pseudocode 1 with LVS's turns: it returns, for each
// of the m slots, the position of the backend that owns it.
func populate(m int, offset, skip []uint64, turns []int) []int32 {
	table := make([]int32, m)
	taken := make([]uint64, (m+63)/64) // a bitset: the probes stay in L1
	type perm struct{ next, skip uint64 }
	ps := make([]perm, len(offset))
	for i := range ps {
		ps[i] = perm{offset[i], skip[i]}
	}
	mm := uint64(m)
	for filled := 0; ; {
		for i := range ps {
			p := &ps[i]
			for range turns[i] {
				c := p.next
				for taken[c/64]&(1<<(c%64)) != 0 {
					if c += p.skip; c >= mm {
						c -= mm
					}
				}
				taken[c/64] |= 1 << (c % 64)
				table[c] = int32(i)
				if c += p.skip; c >= mm {
					c -= mm
				}
				p.next = c
				if filled++; filled == m {
					return table
				}
			}
		}
	}
}

// Pick implements Picker.
func (s *maglevSched) Pick(r *Request) (int, error) {
	if s.table == nil {
		return -1, ErrNoBackend
	}
	j := s.slot(clientHash(r.Client, s.withPort))
	if i := int(s.table[j]); eligible(s.ts, i, r) {
		return i, nil
	}
	for range mhProbes {
		if j++; j == s.m {
			j = 0
		}
		if i := int(s.table[j]); eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return eligibleFrom(s.ts, r, int(j%uint64(len(s.ts))))
}

// slot maps a key hash to its slot, h mod m as in the reference vectors,
// computed without a division (Lemire, Kaser and Kurz, "Faster remainder by
// direct computation", 2019: with c = ⌈2^128/m⌉, h mod m is the top 64 bits
// of ((c·h) mod 2^128)·m, exact for every 64-bit h since m < 2^64).
func (s *maglevSched) slot(h uint64) uint64 {
	hi, lo := bits.Mul64(s.mlo, h)
	hi += s.mhi * h // (c·h) mod 2^128 is hi:lo
	top, _ := bits.Mul64(hi, s.m)
	mid, _ := bits.Mul64(lo, s.m)
	_, carry := bits.Add64(hi*s.m, mid, 0)
	return top + carry
}

// reciprocal returns ⌈2^128/m⌉ as hi:lo, for m > 1 not a power of two.
func reciprocal(m uint64) (hi, lo uint64) {
	hi = math.MaxUint64 / m
	lo, _ = bits.Div64(math.MaxUint64%m, math.MaxUint64, m) // ⌊(2^128−1)/m⌋
	lo, carry := bits.Add64(lo, 1, 0)
	return hi + carry, lo
}

// fnvSeed is h(seed, s): FNV-1a-64 over uint64_le(seed) then s.
func fnvSeed(seed uint64, s string) uint64 {
	const prime = 0x100000001b3
	h := uint64(0xcbf29ce484222325)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	for _, c := range b {
		h = (h ^ uint64(c)) * prime
	}
	for k := 0; k < len(s); k++ {
		h = (h ^ uint64(s[k])) * prime
	}
	return h
}

// clientHash mixes a client address (and port) into 64 bits. Any fixed
// function keeps instances in agreement; this one is one finaliser for
// IPv4 (an IPv4-mapped IPv6 address counts as IPv4) and two for IPv6.
func clientHash(c netip.AddrPort, withPort bool) uint64 {
	var port uint64
	if withPort {
		port = uint64(c.Port()) + 1 // + 1: port 0 differs from "no port"
	}
	a := c.Addr().Unmap()
	if a.Is4() {
		b := a.As4()
		return mix64(uint64(binary.BigEndian.Uint32(b[:])) | port<<32)
	}
	b := a.As16()
	h := mix64(binary.BigEndian.Uint64(b[:8]) ^ 0x9e3779b97f4a7c15 ^ port)
	return mix64(h ^ binary.BigEndian.Uint64(b[8:]))
}

// mix64 is MurmurHash3's 64-bit finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// isPrime reports whether n is prime. ProbablyPrime(0) is Baillie-PSW,
// which is exact for every n below 2^64.
func isPrime(n int) bool {
	return n > 1 && big.NewInt(int64(n)).ProbablyPrime(0)
}
