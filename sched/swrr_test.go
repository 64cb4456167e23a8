package sched

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// nginxSWRR is the reference state machine, written out plainly: from the
// current weights c, one pick over peers with weights w.
func nginxSWRR(c, w []int64) int {
	var total int64
	best := -1
	for k := range c {
		c[k] += w[k]
		total += w[k]
		if best < 0 || c[k] > c[best] {
			best = k
		}
	}
	c[best] -= total
	return best
}

// forceStateMachine switches s to its mutex form at its current start.
func forceStateMachine(s *smoothWeightedRoundRobin) *smoothWeightedRoundRobin {
	if len(s.peers) > 1 {
		s.cur = slices.Clone(s.start)
	}
	return s
}

func TestSWRRVectors(t *testing.T) {
	var v struct {
		Cases []struct {
			ID       string       `json:"id"`
			Backends []vecBackend `json:"backends"`
			Picks    []string     `json:"picks"`
		} `json:"cases"`
	}
	load(t, "nginx_swrr.json", &v)
	if len(v.Cases) < 9 {
		t.Fatalf("only %d cases", len(v.Cases))
	}
	for _, c := range v.Cases {
		for _, form := range []string{"sequence", "statemachine"} {
			t.Run(c.ID+"/"+form, func(t *testing.T) {
				ts := targets(c.Backends)
				s := newSmoothWeightedRoundRobin(ts, nil)
				if form == "statemachine" {
					s = forceStateMachine(s)
				} else if s.cur != nil {
					t.Fatal("built in its state-machine form")
				}
				if got := picks(s, ts, len(c.Picks)); strings.Join(got, "") != strings.Join(c.Picks, "") {
					t.Errorf("picks = %v; want (nginx) %v", got, c.Picks)
				}
			})
		}
	}
}

// TestHandDerived: sequences worked out by hand from the LVS and nginx
// rules, one period each (the test runs two).
//
//	wrr {3,0,1}:   mw 3; cw 3: A; cw 2: A; cw 1: A C            → A A A C
//	wrr {6,4,2}:   gcd 2, mw 5; cw 5: A; cw 3: A B; cw 1: A B C  → A A B A B C
//	wrr {2,2,1}:   cw 2: A B; cw 1: A B C                      → A B A B C
//	wrr {9,6,3,0}: gcd 3, mw 7; cw 7: A; 4: A B; 1: A B C       → A A B A B C
//	swrr {3,0,1}:  (3,1)→A(-1,1); (2,2)→A tie(-2,2); (1,3)→C(1,-1); (4,0)→A(0,0) → A A C A
//	swrr {6,4,2}:  as {3,2,1}, total 6: (3,2,1)→A; (0,4,2)→B; (3,0,3)→A; (0,2,4)→C;
//	               (3,4,-1)→B; (6,0,0)→A                         → A B A C B A
//	swrr {2,2,1}:  (2,2,1)→A; (-1,4,2)→B; (1,1,3)→C; (3,3,-1)→A; (0,5,0)→B → A B C A B
//	swrr {1,1,0,3}: (1,1,3)→D; (2,2,1)→A; (-2,3,4)→D; (-1,4,2)→B; (0,0,5)→D → D A D B D
func TestHandDerived(t *testing.T) {
	for _, c := range []struct {
		sched   Kind
		weights []int
		period  string
	}{
		{"wrr", []int{3, 0, 1}, "AAAC"},
		{"wrr", []int{6, 4, 2}, "AABABC"},
		{"wrr", []int{2, 2, 1}, "ABABC"},
		{"wrr", []int{9, 6, 3, 0}, "AABABC"},
		{"swrr", []int{3, 0, 1}, "AACA"},
		{"swrr", []int{6, 4, 2}, "ABACBA"},
		{"swrr", []int{2, 2, 1}, "ABCAB"},
		{"swrr", []int{1, 1, 0, 3}, "DADBD"},
	} {
		t.Run(string(c.sched)+"/"+weightsName(c.weights), func(t *testing.T) {
			ts := weighted(c.weights...)
			p, err := New(c.sched, ts, nil, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(picks(p, ts, 2*len(c.period)), ""); got != c.period+c.period {
				t.Errorf("picks = %s; want %s", got, c.period+c.period)
			}
		})
	}
}

// weighted returns targets A, B, C, … with the given weights.
func weighted(ws ...int) []Target {
	bs := make([]vecBackend, len(ws))
	for i, w := range ws {
		bs[i] = vecBackend{Name: string(rune('A' + i)), Weight: w}
	}
	return targets(bs)
}

func weightsName(ws []int) string {
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteByte('_')
		}
		b.WriteString(itoa(w))
	}
	return b.String()
}

func randomWeights(r *rand.Rand, zeros bool) []int {
	ws := make([]int, 1+r.IntN(8))
	for i := range ws {
		ws[i] = 1 + r.IntN(12)
		if zeros && r.IntN(5) == 0 {
			ws[i] = 0
		}
	}
	if slices.Max(ws) == 0 {
		ws[0] = 1
	}
	return ws
}

// TestExactProportions: over one period (Σw/gcd picks) wrr and swrr give
// every backend exactly w/gcd picks.
func TestExactProportions(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		ws := randomWeights(r, true)
		g, sum := 0, 0
		for _, w := range ws {
			g, sum = gcd(g, w), sum+w
		}
		for _, name := range []Kind{"wrr", "swrr"} {
			ts := weighted(ws...)
			p, _ := New(name, ts, nil, Options{})
			count := map[string]int{}
			for _, b := range picks(p, ts, sum/g) {
				count[b]++
			}
			for _, tg := range ts {
				if count[tg.B.Name] != tg.Weight/g {
					t.Fatalf("%s %v: %s picked %d times in a period; want %d", name, ws, tg.B.Name, count[tg.B.Name], tg.Weight/g)
				}
			}
		}
	}
}

// maxDeviation is max over backends and prefixes t of |picks_i(t) − t·w_i/W|
// over two periods: how far a sequence strays from the ideal share.
func maxDeviation(seq []string, ts []Target) float64 {
	var total float64
	for _, tg := range ts {
		total += float64(tg.Weight)
	}
	count := map[string]float64{}
	worst := 0.0
	for k, b := range seq {
		count[b]++
		for _, tg := range ts {
			d := math.Abs(count[tg.B.Name] - float64(k+1)*float64(tg.Weight)/total)
			worst = max(worst, d)
		}
	}
	return worst
}

// maxGap is the longest cyclic distance between two picks of name in one
// period.
func maxGap(period []string, name string) int {
	var at []int
	for k, b := range period {
		if b == name {
			at = append(at, k)
		}
	}
	gap := 0
	for k, a := range at {
		next := at[(k+1)%len(at)]
		if next <= a {
			next += len(period)
		}
		gap = max(gap, next-a)
	}
	return gap
}

// TestSWRRSmoothness. The smallest possible longest gap for a backend with
// w of W (in lowest terms) is ⌈W/w⌉; swrr reaches it for every backend of
// the sets below. It is not true of every weight set: {1,1,2} gives C a gap
// of 3 where 2 is possible (C A B C), {6,4,2} gives A 3 where 2 is
// possible, {3,12,11,5} gives B 4 where 3 is (cases below pin these down),
// so over random sets the test holds swrr to its measured
// bound instead: every backend stays within 1.5 picks of its ideal share at
// every point (worst measured ≈ 1.03), while LVS wrr strays further on
// skewed weights.
func TestSWRRSmoothness(t *testing.T) {
	for _, ws := range [][]int{{4, 2, 1}, {5, 1, 1}, {4, 3, 2}, {1, 1, 1}, {2, 2}, {7, 3}, {100, 50, 25}, {3, 0, 1}, {2, 2, 1}} {
		ts := weighted(ws...)
		g, sum := 0, 0
		for _, w := range ws {
			g, sum = gcd(g, w), sum+w
		}
		period := picks(newSmoothWeightedRoundRobin(ts, nil), ts, sum/g)
		for _, tg := range ts {
			if tg.Weight == 0 {
				continue
			}
			want := (sum/g + tg.Weight/g - 1) / (tg.Weight / g)
			if got := maxGap(period, tg.B.Name); got != want {
				t.Errorf("swrr %v: longest gap of %s = %d; want the smallest possible, %d", ws, tg.B.Name, got, want)
			}
		}
	}
	for _, c := range []struct {
		ws   []int
		name string
		gap  int
	}{{[]int{1, 1, 2}, "C", 3}, {[]int{6, 4, 2}, "A", 3}, {[]int{3, 12, 11, 5}, "B", 4}} {
		ts := weighted(c.ws...)
		if got := maxGap(picks(newSmoothWeightedRoundRobin(ts, nil), ts, sumOf(c.ws)/gcdOf(c.ws)), c.name); got != c.gap {
			t.Errorf("swrr %v: longest gap of %s = %d; the known counterexample has %d", c.ws, c.name, got, c.gap)
		}
	}

	r := rand.New(rand.NewPCG(7, 8))
	worst := 0.0
	for range 500 {
		ws := randomWeights(r, false)
		ts := weighted(ws...)
		sum := 0
		for _, w := range ws {
			sum += w
		}
		worst = max(worst, maxDeviation(picks(newSmoothWeightedRoundRobin(ts, nil), ts, 2*sum), ts))
	}
	if worst > 1.5 {
		t.Errorf("swrr strays %.3f picks from the ideal share; want ≤ 1.5", worst)
	}
	t.Logf("swrr worst deviation over 500 random sets: %.3f picks", worst)

	ts := weighted(5, 1, 1)
	sw := maxDeviation(picks(newSmoothWeightedRoundRobin(ts, nil), ts, 14), ts)
	lw := maxDeviation(picks(newWeightedRoundRobin(ts, nil), ts, 14), ts)
	if !(sw < 0.6 && lw > 1.4) {
		t.Errorf("{5,1,1} deviation: swrr %.2f, wrr %.2f; want swrr < 0.6 < 1.4 < wrr", sw, lw)
	}
}

// TestSWRRFormsAgree: the sequence form and the state-machine form give the
// same picks for random weights, from zero and from carried weights, and
// with a backend passed over.
func TestSWRRFormsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for k := range 300 {
		ws := randomWeights(r, true)
		ts := weighted(ws...)
		var prev Picker
		if k%2 == 1 { // carry the current weights of a differently weighted picker
			ts2 := slices.Clone(ts)
			for i := range ts2 {
				ts2[i].Weight = 1 + r.IntN(9)
			}
			warm := newSmoothWeightedRoundRobin(ts2, nil)
			picks(warm, ts2, r.IntN(40))
			prev = warm
		}
		a := newSmoothWeightedRoundRobin(ts, prev)
		b := forceStateMachine(newSmoothWeightedRoundRobin(ts, prev))
		sum := 0
		for _, w := range ws {
			sum += w
		}
		if x, y := picks(a, ts, 3*sum), picks(b, ts, 3*sum); !slices.Equal(x, y) {
			t.Fatalf("case %d %v: sequence %v; state machine %v", k, ws, x, y)
		}
		ts[0].B.Drain(t.Context()) // nothing open: returns at once
		x, y := picks(a, ts, 2*sum), picks(b, ts, 2*sum)
		ts[0].B.Undrain()
		if !slices.Equal(x, y) {
			t.Fatalf("case %d %v, A draining: sequence %v; state machine %v", k, ws, x, y)
		}
	}
}

// TestSWRRCarriesCurrentWeights: a rebuild starts from the current weights
// of the backends it keeps (new ones at 0) and then runs the nginx state
// machine from there, in both forms.
func TestSWRRCarriesCurrentWeights(t *testing.T) {
	ts := weighted(4, 2, 1)
	s := newSmoothWeightedRoundRobin(ts, nil)
	if got := strings.Join(picks(s, ts, 3), ""); got != "ABA" {
		t.Fatalf("first picks = %s; want ABA", got)
	}
	// nginx trace: (4,2,1)→A(-3,2,1); (1,4,2)→B(1,-3,2); (5,-1,3)→A(-2,-1,3).
	d := weighted(0, 0, 0, 1)[3]
	ts2 := []Target{{B: ts[2].B, Weight: 1}, {B: ts[0].B, Weight: 4}, d, {B: ts[1].B, Weight: 3}} // C A D B
	want := []int64{3, -2, 0, -1}
	for _, form := range []string{"sequence", "statemachine"} {
		t.Run(form, func(t *testing.T) {
			n := newSmoothWeightedRoundRobin(ts2, s)
			if form == "statemachine" {
				n = forceStateMachine(n)
			}
			if !slices.Equal(n.start, want) {
				t.Fatalf("carried current weights = %v; want %v (C, A, D new, B)", n.start, want)
			}
			c, w := slices.Clone(want), []int64{1, 4, 1, 3}
			var ref []string
			for range 40 {
				ref = append(ref, ts2[nginxSWRR(c, w)].B.Name)
			}
			if got := picks(n, ts2, 40); !slices.Equal(got, ref) {
				t.Errorf("picks after the rebuild = %v; want nginx from the carried state %v", got, ref)
			}
			if got := n.current(); got[ts[0].B] != c[1] || got[d.B] != c[2] {
				t.Errorf("current() after 40 picks = %v; want %v", got, c)
			}
		})
	}
}

// TestWRRRestartsOnRebuild: wrr starts a fresh cycle after a rebuild.
func TestWRRRestartsOnRebuild(t *testing.T) {
	ts := weighted(4, 3, 2)
	s := newWeightedRoundRobin(ts, nil)
	picks(s, ts, 4) // A A B A
	ts2 := slices.Clone(ts)
	ts2[1].Weight = 1
	if got := strings.Join(picks(newWeightedRoundRobin(ts2, s), ts2, 7), ""); got != "AAACABC" {
		t.Errorf("picks after the rebuild = %s; want a fresh {4,1,2} cycle AAACABC", got)
	}
}

func sumOf(ws []int) (s int) {
	for _, w := range ws {
		s += w
	}
	return s
}

func gcdOf(ws []int) (g int) {
	for _, w := range ws {
		g = gcd(g, w)
	}
	return g
}
