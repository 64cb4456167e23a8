package sched

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"fulcrum/backend"
)

func TestSourceHashVectors(t *testing.T) {
	type lookup struct {
		Src      string `json:"src"`
		Bucket   uint32 `json:"bucket"`
		WithPort uint32 `json:"bucket_with_port_1234"`
		Dest     string `json:"dest"`
		Fallback string `json:"get_fallback"`
	}
	var sh struct {
		SH struct {
			A2B1C1 struct {
				Buckets []string     `json:"buckets"`
				Dests   []vecBackend `json:"dests"`
				Lookups []lookup     `json:"lookups"`
			} `json:"weights_A2_B1_C1"`
			A2B0C1 struct {
				Buckets []string     `json:"buckets"`
				Dests   []vecBackend `json:"dests"`
				Lookups []lookup     `json:"lookups"`
			} `json:"weights_A2_B0_C1"`
		} `json:"sh"`
	}
	load(t, "lvs_misc.json", &sh)
	for _, c := range []struct {
		id      string
		buckets []string
		dests   []vecBackend
		lookups []lookup
	}{
		{"A2_B1_C1", sh.SH.A2B1C1.Buckets, sh.SH.A2B1C1.Dests, sh.SH.A2B1C1.Lookups},
		{"A2_B0_C1", sh.SH.A2B0C1.Buckets, sh.SH.A2B0C1.Dests, sh.SH.A2B0C1.Lookups},
	} {
		t.Run(c.id, func(t *testing.T) {
			ts := targets(c.dests)
			s, sp := newSourceHash(ts, false), newSourceHash(ts, true)
			var got []string
			for _, i := range s.buckets {
				got = append(got, ts[i].B.Name)
			}
			if !slices.Equal(got, c.buckets) {
				t.Fatalf("buckets = %v; want (LVS) %v", got, c.buckets)
			}
			if len(c.lookups) < 6 {
				t.Fatalf("only %d lookups", len(c.lookups))
			}
			for _, l := range c.lookups {
				a := netip.AddrPortFrom(netip.MustParseAddr(l.Src), 1234)
				if h := s.hash(a); h != l.Bucket {
					t.Errorf("bucket(%s) = %d; want %d", l.Src, h, l.Bucket)
				}
				if l.WithPort != 0 || l.Dest != "" {
					if h := sp.hash(a); h != l.WithPort {
						t.Errorf("bucket(%s port 1234) = %d; want %d", l.Src, h, l.WithPort)
					}
				}
				want := l.Dest + l.Fallback // one of the two is given per table
				r := Request{Client: a}
				if i, err := s.Pick(&r); err != nil || ts[i].B.Name != want {
					t.Errorf("Pick(%s) = %d, %v; want %s", l.Src, i, err, want)
				}
			}
		})
	}
}

// TestSourceHashIPv6AndMapped: IPv4-mapped clients hash as IPv4; IPv6
// addresses fold their four words.
func TestSourceHashIPv6AndMapped(t *testing.T) {
	s := newSourceHash(weighted(1, 1, 1), false)
	v4 := netip.MustParseAddrPort("10.0.0.1:1")
	mapped := netip.MustParseAddrPort("[::ffff:10.0.0.1]:2")
	if s.hash(v4) != s.hash(mapped) {
		t.Error("an IPv4-mapped client hashes differently from its IPv4 form")
	}
	v6 := netip.MustParseAddrPort("[2001:db8::1]:1") // words 0x20010db8 ^ 0 ^ 0 ^ 1
	fold, golden := uint32(0x20010db8^1), uint32(0x61C88647)
	if want := fold * golden >> 24; s.hash(v6) != want {
		t.Errorf("hash(%v) = %d; want %d", v6, s.hash(v6), want)
	}
}

// TestSourceHashLargeWeights: weights divided by their gcd, and a table
// large enough to honour them.
func TestSourceHashLargeWeights(t *testing.T) {
	ws := make([]int, 1000)
	for i := range ws {
		ws[i] = 100 * (1 + i%3)
	}
	ts := weighted(ws...)
	s := newSourceHash(ts, false)
	count := make([]int, len(ts))
	for _, i := range s.buckets {
		count[i]++
	}
	for i, w := range ws {
		share := float64(count[i]) * 2000 / float64(len(s.buckets)) // Σ w/100 = 2000 (rounded)
		if want := float64(w / 100); share < want*0.9 || share > want*1.1 {
			t.Fatalf("backend %d (weight %d) owns %d of %d buckets; want ≈ %v·%d/2000", i, w, count[i], len(s.buckets), want, len(s.buckets))
		}
	}
}

// maglevNames builds targets with the given names, weight 1.
func maglevNames(names ...string) []Target {
	ts := make([]Target, len(names))
	for i, n := range names {
		ts[i] = Target{B: backend.New("s", n), Weight: 1}
	}
	return ts
}

func tableNames(s *maglevSched) []string {
	out := make([]string, len(s.table))
	for j, i := range s.table {
		out[j] = s.ts[i].B.Name
	}
	return out
}

func tableDigest(names []string) string {
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestMaglevPaperExample(t *testing.T) {
	var v struct {
		M7 struct {
			Table   []string `json:"table"`
			Removed []string `json:"table_after_removing_B1"`
		} `json:"paper_style_example_M7"`
	}
	load(t, "maglev.json", &v)
	name := func(tab []int32, names []string) []string {
		out := make([]string, len(tab))
		for j, i := range tab {
			out[j] = names[i]
		}
		return out
	}
	got := name(populate(7, []uint64{3, 0, 3}, []uint64{4, 2, 1}, []int{1, 1, 1}), []string{"B0", "B1", "B2"})
	if !slices.Equal(got, v.M7.Table) {
		t.Errorf("M=7 table = %v; want %v", got, v.M7.Table)
	}
	got = name(populate(7, []uint64{3, 3}, []uint64{4, 1}, []int{1, 1}), []string{"B0", "B2"})
	if !slices.Equal(got, v.M7.Removed) {
		t.Errorf("M=7 table without B1 = %v; want %v", got, v.M7.Removed)
	}
}

// vecNames reads a backend list written either as names (weight 1) or as
// {name, weight} objects.
type vecNames []vecBackend

func (v *vecNames) UnmarshalJSON(b []byte) error {
	var names []string
	if err := json.Unmarshal(b, &names); err == nil {
		for _, n := range names {
			*v = append(*v, vecBackend{Name: n, Weight: 1})
		}
		return nil
	}
	return json.Unmarshal(b, (*[]vecBackend)(v))
}

type maglevCase struct {
	Backends vecNames          `json:"backends"`
	Table    []string          `json:"table"`
	First32  []string          `json:"table_first_32"`
	Digest   string            `json:"table_sha256"`
	Counts   map[string]int    `json:"counts"`
	Offset   map[string]uint64 `json:"offset"`
	Skip     map[string]uint64 `json:"skip"`
	Lookups  []struct {
		Backend string `json:"backend"`
		Key     string `json:"key"`
		Hash    string `json:"hash"`
		RawHash string `json:"raw_hash"`
		Slot    uint64 `json:"slot"`
	} `json:"lookups"`
	Remove *maglevCase `json:"remove_backend-b"`
	Add    *maglevCase `json:"add_backend-d"`
}

func TestMaglevVectors(t *testing.T) {
	var v struct {
		Hash struct {
			Sanity map[string]string `json:"sanity"`
		} `json:"hash_functions"`
		M13    maglevCase `json:"fnv_M13"`
		M65537 maglevCase `json:"fnv_M65537"`
		Turns  maglevCase `json:"ipvs_mh_weighted_turns_M13"`
	}
	load(t, "maglev.json", &v)
	for k, want := range v.Hash.Sanity {
		var seed uint64
		var name string
		if _, err := fmt.Sscanf(k, "h(%d,%q)", &seed, &name); err != nil {
			continue // the plain fnv1a64 lines
		}
		if got := fmt.Sprintf("0x%016x", fnvSeed(seed, name)); got != want {
			t.Errorf("%s = %s; want %s", k, got, want)
		}
	}
	check := func(t *testing.T, m int, c *maglevCase) *maglevSched {
		t.Helper()
		ts := targets(c.Backends)
		s, err := newMaglevSched(ts, m, false)
		if err != nil {
			t.Fatal(err)
		}
		names := tableNames(s)
		if c.Table != nil && !slices.Equal(names, c.Table) {
			t.Errorf("table = %v; want %v", names, c.Table)
		}
		if c.First32 != nil && !slices.Equal(names[:32], c.First32) {
			t.Errorf("table[:32] = %v; want %v", names[:32], c.First32)
		}
		if c.Digest != "" && tableDigest(names) != c.Digest {
			t.Errorf("table sha256 = %s; want %s", tableDigest(names), c.Digest)
		}
		count := map[string]int{}
		for _, n := range names {
			count[n]++
		}
		if c.Counts != nil && fmt.Sprint(count) != fmt.Sprint(c.Counts) {
			t.Errorf("slots per backend = %v; want %v", count, c.Counts)
		}
		for name, want := range c.Offset {
			if got := fnvSeed(0, name) % uint64(m); got != want {
				t.Errorf("offset(%s) = %d; want %d", name, got, want)
			}
			if got := fnvSeed(1, name)%uint64(m-1) + 1; got != c.Skip[name] {
				t.Errorf("skip(%s) = %d; want %d", name, got, c.Skip[name])
			}
		}
		for _, l := range c.Lookups {
			h, err := strconv.ParseUint(strings.TrimPrefix(l.Hash+l.RawHash, "0x"), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			if l.Key != "" && fnvSeed(2, l.Key) != h {
				t.Errorf("h(2, %q) = %#x; want %s", l.Key, fnvSeed(2, l.Key), l.Hash)
			}
			if j := s.slot(h); j != l.Slot || ts[s.table[j]].B.Name != l.Backend {
				t.Errorf("lookup %s: slot %d (%s); want %d (%s)", l.Hash, j, ts[s.table[j]].B.Name, l.Slot, l.Backend)
			}
		}
		return s
	}
	for _, c := range []struct {
		id string
		m  int
		c  *maglevCase
	}{{"M13", 13, &v.M13}, {"M65537", 65537, &v.M65537}, {"turns_M13", 13, &v.Turns}} {
		t.Run(c.id, func(t *testing.T) {
			if len(c.c.Backends) == 0 {
				t.Fatal("no backends in the vector")
			}
			check(t, c.m, c.c)
			if c.c.Remove != nil {
				check(t, c.m, c.c.Remove)
			}
			if c.c.Add != nil {
				check(t, c.m, c.c.Add)
			}
		})
	}
}

func hundred(skip int) []Target {
	var names []string
	for i := range 100 {
		if i != skip {
			names = append(names, "backend-"+strconv.Itoa(i))
		}
	}
	return maglevNames(names...)
}

// TestMaglevBalance: with 100 equal backends and M = 65537, the most and
// least loaded own within 1% of the average share.
func TestMaglevBalance(t *testing.T) {
	s, err := newMaglevSched(hundred(-1), 65537, false)
	if err != nil {
		t.Fatal(err)
	}
	count := make([]int, 100)
	for _, i := range s.table {
		count[i]++
	}
	avg := 65537.0 / 100
	hi, lo := float64(slices.Max(count))/avg, float64(slices.Min(count))/avg
	t.Logf("100 backends, M 65537: max/avg %.4f, min/avg %.4f", hi, lo)
	if hi > 1.01 || lo < 0.99 {
		t.Errorf("max/avg %.4f, min/avg %.4f; want both within 1%%", hi, lo)
	}
}

// TestMaglevDisruption: removing one of 100 backends moves at most 2% of
// the table (1% is the ideal: the removed backend's own slots). Every
// instance builds the same table: no seed.
func TestMaglevDisruption(t *testing.T) {
	before, _ := newMaglevSched(hundred(-1), 65537, false)
	again, _ := newMaglevSched(hundred(-1), 65537, false)
	if !slices.Equal(tableNames(before), tableNames(again)) {
		t.Fatal("two builds from the same configuration differ")
	}
	for _, gone := range []int{0, 57, 99} {
		after, _ := newMaglevSched(hundred(gone), 65537, false)
		a, b := tableNames(before), tableNames(after)
		moved := 0
		for j := range a {
			if a[j] != b[j] {
				moved++
			}
		}
		frac := float64(moved) / 65537
		t.Logf("removing backend-%d of 100 moves %.2f%% of the slots", gone, 100*frac)
		if frac > 0.02 {
			t.Errorf("removing backend-%d moved %.2f%% of the slots; want ≤ 2%%", gone, 100*frac)
		}
	}
}

// TestMaglevClients: almost every client keeps its backend when an
// unrelated backend is added (the new one takes ≈ 1% of the slots, and
// Maglev moves ≈ 0.6% more between old backends); an ineligible backend's
// clients spread over the others.
func TestMaglevClients(t *testing.T) {
	ts := hundred(-1)
	s, _ := newMaglevSched(ts, 65537, false)
	s2, _ := newMaglevSched(append(slices.Clone(ts), maglevNames("backend-new")...), 65537, false)
	moved, spread := 0, map[int]bool{}
	for k := range 2000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k >> 8), byte(k), 1}), uint16(k))
		r := Request{Client: c}
		i, _ := s.Pick(&r)
		j, _ := s2.Pick(&r)
		if i != j {
			moved++
		}
		if i == 3 {
			r.MarkTried(3)
			f, err := s.Pick(&r)
			if err != nil || f == 3 {
				t.Fatalf("fallback for %v = %d, %v", c, f, err)
			}
			spread[f] = true
		}
	}
	t.Logf("adding a 101st backend moved %d of 2000 clients", moved)
	if moved > 2000*3/100 {
		t.Errorf("%d of 2000 clients moved when one backend was added to 100", moved)
	}
	if len(spread) < 5 {
		t.Errorf("backend 3's clients fell back to only %d backends", len(spread))
	}
}

func TestMaglevTableSize(t *testing.T) {
	for _, m := range []int{0, 1, 4, 65536, MaxTableSize + 2, 3} {
		if _, err := newMaglevSched(weighted(1, 1, 1), m, false); err == nil {
			t.Errorf("newMaglevSched(3 backends, M %d) succeeded", m)
		}
	}
	if _, err := New("mh", weighted(1, 1), nil, Options{HashKey: "port"}); err == nil {
		t.Error(`New(mh, hash_key "port") succeeded`)
	}
	if _, err := New("p2c", weighted(1, 1), nil, Options{Choices: MaxChoices + 1}); err == nil {
		t.Error("New(p2c, too many choices) succeeded")
	}
}

// TestMaglevSlot: the division-free slot is h mod m for every m and h tried.
func TestMaglevSlot(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, m := range []int{3, 7, 13, 251, 65537, 655373, MaxTableSize} {
		s, err := newMaglevSched(nil, m, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []uint64{0, 1, uint64(m) - 1, uint64(m), math.MaxUint64, math.MaxUint64 - 1, 1 << 63} {
			if got := s.slot(h); got != h%uint64(m) {
				t.Fatalf("slot(%#x) with m %d = %d; want %d", h, m, got, h%uint64(m))
			}
		}
		for range 100000 {
			if h := r.Uint64(); s.slot(h) != h%uint64(m) {
				t.Fatalf("slot(%#x) with m %d = %d; want %d", h, m, s.slot(h), h%uint64(m))
			}
		}
	}
}

// TestClientHash: IPv4-mapped clients hash as IPv4; with ip_port the port
// matters, without it not.
func TestClientHash(t *testing.T) {
	v4 := netip.MustParseAddrPort("10.0.0.1:1")
	mapped := netip.MustParseAddrPort("[::ffff:10.0.0.1]:2")
	if clientHash(v4, false) != clientHash(mapped, false) {
		t.Error("an IPv4-mapped client hashes differently from its IPv4 form")
	}
	if clientHash(v4, true) == clientHash(mapped, true) {
		t.Error("with the port in the key, ports 1 and 2 hash alike")
	}
	v6 := netip.MustParseAddrPort("[2001:db8::1]:1")
	if clientHash(v6, false) == clientHash(v4, false) || clientHash(v6, true) == clientHash(v6, false) {
		t.Error("IPv6 hashes collide")
	}
}
