package sched

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"

	"fulcrum/backend"
)

// benchTargets returns n targets with distinct names and weights 1..10.
func benchTargets(n int) []Target {
	r := rand.New(rand.NewPCG(3, 4))
	ts := make([]Target, n)
	for i := range ts {
		ts[i] = Target{B: backend.New("s", "b"+itoa(i)), Weight: 1 + r.IntN(10)}
	}
	return ts
}

// benchClients are 1024 client addresses, so that sh and mh read the table
// (and the targets) in many places, as under real traffic.
var benchClients = func() []netip.AddrPort {
	r := rand.New(rand.NewPCG(7, 7))
	cs := make([]netip.AddrPort, 1024)
	for i := range cs {
		cs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}), uint16(r.IntN(65536)))
	}
	return cs
}()

// BenchmarkPick: one pick, every scheduler, 3 to 10,000 backends, clients
// taken in turn from benchClients.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{3, 100, 10000} {
		ts := benchTargets(n)
		for _, name := range Names {
			p, err := New(name, ts, nil, Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Run(string(name)+"/n="+itoa(n), func(b *testing.B) {
				b.ReportAllocs()
				var req Request
				k := 0
				for b.Loop() {
					req.Client = benchClients[k&1023]
					k++
					if _, err := p.Pick(&req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkFirstWriter: first with a sticky writer (failback) in the
// middle of the list, the pick reading it ahead of the list order.
func BenchmarkFirstWriter(b *testing.B) {
	for _, n := range []int{3, 100, 10000} {
		ts := benchTargets(n)
		p, err := New("first", ts, nil, Options{Writer: ts[n/2].B.Name})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("n="+itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			var req Request
			for b.Loop() {
				if i, err := p.Pick(&req); err != nil || i != n/2 {
					b.Fatal(i, err)
				}
			}
		})
	}
}

// BenchmarkBuild: building each scheduler for 10,000 backends (mh's table
// included).
func BenchmarkBuild(b *testing.B) {
	ts := benchTargets(10000)
	for _, name := range Names {
		b.Run(string(name)+"/n=10000", func(b *testing.B) {
			for b.Loop() {
				if _, err := New(name, ts, nil, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("swrr-sequence/n=100", func(b *testing.B) { // the largest swrr that precomputes here
		ts := benchTargets(100)
		for b.Loop() {
			if s := newSmoothWeightedRoundRobin(ts, nil); s.cur != nil {
				b.Fatal("built the state machine")
			}
		}
	})
}

// mutexRR is round robin as a mutex-protected position: the design the
// atomic counter replaces.
type mutexRR struct {
	ts  []Target
	mu  sync.Mutex // protects pos
	pos int
}

func (s *mutexRR) Pick(r *Request) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range len(s.ts) {
		i := s.pos
		s.pos = (s.pos + 1) % len(s.ts)
		if eligible(s.ts, i, r) {
			return i, nil
		}
	}
	return -1, ErrNoBackend
}

// mutexWRR is the LVS walk with its (cl, cw) under a mutex, as the kernel
// does with its sched_lock.
type mutexWRR struct {
	s      *weightedRoundRobin
	mu     sync.Mutex // protects cl, cw
	cl, cw int
}

func (m *mutexWRR) Pick(r *Request) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.s
	for range s.skips {
		j := s.tree.first(m.cl+1, m.cw)
		for j < 0 {
			m.cl, m.cw = -1, m.cw-s.di
			if m.cw <= 0 {
				m.cw = s.mw
			}
			j = s.tree.first(0, m.cw)
		}
		m.cl = j
		if eligible(s.ts, j, r) {
			return j, nil
		}
	}
	return firstEligible(s.ts, r)
}

// BenchmarkContention: picks from every core at once (b.RunParallel), the
// lock-free designs against mutex ones. All forms of a scheduler give the
// same sequence (tests hold them to it), so the faster is kept.
func BenchmarkContention(b *testing.B) {
	ts := benchTargets(100)
	wrr := newWeightedRoundRobin(ts, nil)
	walk := forceWalk(newWeightedRoundRobin(ts, nil))
	for _, c := range []struct {
		name string
		p    Picker
	}{
		{"rr/atomic", newRoundRobin(ts, nil)},
		{"rr/mutex", &mutexRR{ts: ts}},
		{"wrr/atomic-cycle", wrr},
		{"wrr/cas-walk", walk},
		{"wrr/mutex-walk", &mutexWRR{s: walk, cl: -1, cw: walk.mw}},
		{"swrr/atomic-sequence", newSmoothWeightedRoundRobin(ts, nil)},
		{"swrr/mutex-statemachine", forceStateMachine(newSmoothWeightedRoundRobin(ts, nil))},
	} {
		b.Run(c.name+"/n=100", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var r Request
				for pb.Next() {
					if _, err := c.p.Pick(&r); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestMutexBaselinesMatch: the benchmark's mutex designs give the same
// sequences as the production forms, so the comparison is like for like.
func TestMutexBaselinesMatch(t *testing.T) {
	ts := benchTargets(100)
	walk := forceWalk(newWeightedRoundRobin(ts, nil))
	if a, b := picks(newWeightedRoundRobin(ts, nil), ts, 2000), picks(&mutexWRR{s: walk, cl: -1, cw: walk.mw}, ts, 2000); !slices.Equal(a, b) {
		t.Error("mutexWRR differs from wrr")
	}
	if a, b := picks(newRoundRobin(ts, nil), ts, 300), picks(&mutexRR{ts: ts}, ts, 300); !slices.Equal(a, b) {
		t.Error("mutexRR differs from rr")
	}
}

// arrayRandom is CoSky's ArrayWeightRandom: each target repeated weight
// times. O(1) pick, O(Σw) memory and build.
type arrayRandom struct{ line []int32 }

func newArrayRandom(ts []Target) *arrayRandom {
	a := &arrayRandom{}
	for i, t := range ts {
		for range t.Weight {
			a.line = append(a.line, int32(i))
		}
	}
	return a
}

func (a *arrayRandom) pick() int { return int(a.line[rand.Uint64N(uint64(len(a.line)))]) }

// prefixRandom is prefix sums plus binary search (CoSky's Binary/Tree):
// O(log n) pick, O(n) memory.
type prefixRandom struct{ sums []uint64 }

func newPrefixRandom(ts []Target) *prefixRandom {
	p := &prefixRandom{sums: make([]uint64, len(ts))}
	var s uint64
	for i, t := range ts {
		s += uint64(t.Weight)
		p.sums[i] = s
	}
	return p
}

func (p *prefixRandom) pick() int {
	x := rand.Uint64N(p.sums[len(p.sums)-1])
	return sort.Search(len(p.sums), func(i int) bool { return p.sums[i] > x })
}

// TestWeightedRandomBaselines: the baselines pick target i for exactly the
// random values the reference vectors say.
func TestWeightedRandomBaselines(t *testing.T) {
	var v struct {
		Cases []struct {
			Backends []vecBackend `json:"backends"`
			Tree     []string     `json:"tree_choose_r_0_to_total_minus_1"`
		} `json:"cases"`
	}
	load(t, "weighted_random.json", &v)
	for _, c := range v.Cases {
		ts := targets(c.Backends)
		a, p := newArrayRandom(ts), newPrefixRandom(ts)
		for x, want := range c.Tree {
			i := sort.Search(len(p.sums), func(i int) bool { return p.sums[i] > uint64(x) })
			if ts[a.line[x]].B.Name != want || ts[i].B.Name != want {
				t.Errorf("r = %d: array %s, prefix %s; want %s", x, ts[a.line[x]].B.Name, ts[i].B.Name, want)
			}
		}
	}
}

// BenchmarkWeightedRandom: the alias table against the expanded array and
// prefix sums, with weights 1..1000. table-B is each design's memory.
func BenchmarkWeightedRandom(b *testing.B) {
	for _, n := range []int{3, 100, 10000} {
		r := rand.New(rand.NewPCG(5, 6))
		ts := make([]Target, n)
		for i := range ts {
			ts[i] = Target{B: backend.New("s", "b"+itoa(i)), Weight: 1 + r.IntN(1000)}
		}
		alias, array, prefix := newWeightedRandom(ts, nil), newArrayRandom(ts), newPrefixRandom(ts)
		sink := 0
		b.Run("alias/n="+itoa(n), func(b *testing.B) {
			b.ReportMetric(float64(len(alias.col)*16), "table-B")
			for b.Loop() {
				sink += alias.draw()
			}
		})
		b.Run("array/n="+itoa(n), func(b *testing.B) {
			b.ReportMetric(float64(len(array.line)*4), "table-B")
			for b.Loop() {
				sink += array.pick()
			}
		})
		b.Run("prefix/n="+itoa(n), func(b *testing.B) {
			b.ReportMetric(float64(len(prefix.sums)*8), "table-B")
			for b.Loop() {
				sink += prefix.pick()
			}
		})
		b.Run("build-alias/n="+itoa(n), func(b *testing.B) {
			for b.Loop() {
				newWeightedRandom(ts, nil)
			}
		})
		b.Run("build-array/n="+itoa(n), func(b *testing.B) {
			for b.Loop() {
				newArrayRandom(ts)
			}
		})
		_ = sink
	}
}
