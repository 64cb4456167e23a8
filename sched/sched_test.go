package sched

import (
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"fulcrum/backend"
)

// The vectors in testdata/ were transcribed from the reference sources (LVS,
// nginx, HAProxy, Envoy, Maglev); see testdata/REFERENCE.md for each.

func load(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

type vecBackend struct {
	Name        string `json:"name"`
	Weight      int    `json:"weight"`
	ActiveConns int64  `json:"activeconns"`
	InactConns  int64  `json:"inactconns"`
	Overloaded  bool   `json:"overloaded"`
}

func targets(bs []vecBackend) []Target {
	ts := make([]Target, len(bs))
	for i, b := range bs {
		ts[i] = Target{B: backend.New("s", b.Name), Weight: b.Weight}
	}
	return ts
}

// picks runs n picks and names them; "NULL" for ErrNoBackend.
func picks(p Picker, ts []Target, n int) []string {
	out := make([]string, n)
	for k := range out {
		var r Request
		i, err := p.Pick(&r)
		if err != nil {
			out[k] = "NULL"
			continue
		}
		out[k] = ts[i].B.Name
	}
	return out
}

func TestWRRVectors(t *testing.T) {
	var v struct {
		Cases []struct {
			ID       string       `json:"id"`
			Backends []vecBackend `json:"backends"`
			Fresh    struct {
				Picks []*string `json:"picks"`
			} `json:"fresh_init_svc"`
		} `json:"cases"`
	}
	load(t, "lvs_wrr.json", &v)
	if len(v.Cases) < 10 {
		t.Fatalf("only %d cases", len(v.Cases))
	}
	for _, c := range v.Cases {
		want := make([]string, len(c.Fresh.Picks))
		for i, p := range c.Fresh.Picks {
			if p == nil {
				want[i] = "NULL"
			} else {
				want[i] = *p
			}
		}
		for _, form := range []string{"cycle", "walk"} {
			t.Run(c.ID+"/"+form, func(t *testing.T) {
				ts := targets(c.Backends)
				s := newWeightedRoundRobin(ts, nil)
				if form == "walk" {
					s = forceWalk(s)
				}
				if got := picks(s, ts, len(want)); strings.Join(got, " ") != strings.Join(want, " ") {
					t.Errorf("picks =\n%v\nwant (LVS)\n%v", got, want)
				}
			})
		}
	}
}

// forceWalk rebuilds s in its walk form, as if its cycle were too long.
func forceWalk(s *weightedRoundRobin) *weightedRoundRobin {
	w := make([]int, len(s.ts))
	for i, t := range s.ts {
		w[i] = t.Weight
	}
	s.seq.loop = nil
	if s.mw > 0 {
		s.tree = newMaxTree(w)
		s.state.Store(uint64(s.mw))
	}
	return s
}

// TestWRRWalkMatchesCycle: over random weight sets (zeros included) the two
// forms give the same sequence for two full periods.
func TestWRRWalkMatchesCycle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for k := range 300 {
		n := 1 + r.IntN(12)
		bs := make([]vecBackend, n)
		sum := 0
		for i := range bs {
			bs[i] = vecBackend{Name: string(rune('A' + i)), Weight: r.IntN(7) * (1 + r.IntN(3))}
			sum += bs[i].Weight
		}
		ts := targets(bs)
		a := picks(newWeightedRoundRobin(ts, nil), ts, 2*sum+1)
		b := picks(forceWalk(newWeightedRoundRobin(ts, nil)), ts, 2*sum+1)
		if strings.Join(a, "") != strings.Join(b, "") {
			t.Fatalf("case %d %v: cycle %v; walk %v", k, bs, a, b)
		}
	}
}

// TestWRRSkipsIneligible: a tried or draining target is passed over as LVS
// passes over an overloaded dest, and the cycle moves on past it.
func TestWRRSkipsIneligible(t *testing.T) {
	ts := targets([]vecBackend{{Name: "A", Weight: 3}, {Name: "B", Weight: 2}, {Name: "C", Weight: 1}})
	for _, form := range []string{"cycle", "walk"} {
		t.Run(form, func(t *testing.T) {
			s := newWeightedRoundRobin(ts, nil) // cycle A A B A B C
			if form == "walk" {
				s = forceWalk(s)
			}
			var r Request
			r.MarkTried(0)
			if i, _ := s.Pick(&r); ts[i].B.Name != "B" {
				t.Errorf("Pick with A tried = %s; want B", ts[i].B.Name)
			}
			ts[1].B.Drain(t.Context()) // nothing open: returns at once, leaves B draining
			defer ts[1].B.Undrain()
			if got := picks(s, ts, 4); strings.Join(got, "") != "ACAA" {
				t.Errorf("picks with B draining = %v; want A C A A", got)
			}
		})
	}
}

func TestRRVectors(t *testing.T) {
	var v struct {
		RR []struct {
			ID    string       `json:"id"`
			Dests []vecBackend `json:"dests"`
			Picks []string     `json:"picks"`
		} `json:"rr"`
	}
	load(t, "lvs_misc.json", &v)
	for _, c := range v.RR {
		t.Run(c.ID, func(t *testing.T) {
			ts := targets(c.Dests)
			s := newRoundRobin(ts, nil)
			if c.ID == "quiesce_A_after_2" {
				// LVS keeps its position when a weight changes: two picks, then
				// A is set to weight 0 and the scheduler rebuilt from s.
				got := picks(s, ts, 2)
				ts2 := append([]Target(nil), ts...)
				ts2[0].Weight = 0
				got = append(got, picks(newRoundRobin(ts2, s), ts2, len(c.Picks)-2)...)
				if strings.Join(got, "") != strings.Join(c.Picks, "") {
					t.Errorf("picks = %v; want %v", got, c.Picks)
				}
				return
			}
			if got := picks(s, ts, len(c.Picks)); strings.Join(got, "") != strings.Join(c.Picks, "") {
				t.Errorf("picks = %v; want %v", got, c.Picks)
			}
		})
	}
}

// lcFamily are the least-connection schedulers, by config name.
var lcFamily = []string{"lc", "wlc", "sed", "nq"}

func TestLCFamilyVectors(t *testing.T) {
	var v struct {
		Cases []struct {
			ID    string            `json:"id"`
			Dests []vecBackend      `json:"dests"`
			Want  map[string]string `json:"-"`
			LC    *string           `json:"lc"`
			WLC   *string           `json:"wlc"`
			SED   *string           `json:"sed"`
			NQ    *string           `json:"nq"`
		} `json:"cases"`
		Sequences []struct {
			ID    string       `json:"id"`
			Dests []vecBackend `json:"dests"`
			LC    []string     `json:"lc"`
			WLC   []string     `json:"wlc"`
			SED   []string     `json:"sed"`
			NQ    []string     `json:"nq"`
		} `json:"sequences"`
	}
	load(t, "wlc.json", &v)
	if len(v.Cases) < 15 || len(v.Sequences) < 4 {
		t.Fatalf("only %d cases, %d sequences", len(v.Cases), len(v.Sequences))
	}
	for _, c := range v.Cases {
		for k, want := range []*string{c.LC, c.WLC, c.SED, c.NQ} {
			name := lcFamily[k]
			t.Run(c.ID+"/"+name, func(t *testing.T) {
				ts := targets(c.Dests)
				for i, d := range c.Dests {
					if d.InactConns != 0 {
						t.Skip("inactive connections do not exist in a proxy")
					}
					for range d.ActiveConns {
						ts[i].B.Acquire(0)
					}
					if d.Overloaded { // LVS's overloaded dest: here, a full one
						ts[i].MaxConns = max(int(d.ActiveConns), 1)
						ts[i].B.Acquire(0)
					}
				}
				w := "NULL"
				if want != nil {
					w = *want
				}
				p, _ := New(Kind(name), ts, nil, Options{})
				if got := picks(p, ts, 1)[0]; got != w {
					t.Errorf("Pick = %s; want %s (LVS %s)", got, w, name)
				}
			})
		}
	}
	for _, c := range v.Sequences {
		for k, want := range [][]string{c.LC, c.WLC, c.SED, c.NQ} {
			name := lcFamily[k]
			t.Run(c.ID+"/"+name, func(t *testing.T) {
				ts := targets(c.Dests)
				for i, d := range c.Dests {
					for range d.ActiveConns {
						ts[i].B.Acquire(0)
					}
				}
				p, _ := New(Kind(name), ts, nil, Options{})
				var got []string
				for range want {
					var r Request
					i, err := p.Pick(&r)
					if err != nil {
						t.Fatal(err)
					}
					ts[i].B.Acquire(0) // each pick opens a connection; none closes
					got = append(got, ts[i].B.Name)
				}
				if !slices.Equal(got, want) {
					t.Errorf("picks = %v; want %v", got, want)
				}
			})
		}
	}
}

// TestCrossMultiplication: wlc's comparison is a/wa < b/wb as b·wa > a·wb
// in int64, with ties to the earlier target; no division, no overflow at
// counts far past 2^32.
func TestCrossMultiplication(t *testing.T) {
	for _, c := range []struct {
		o, w, bo, bw int64
		want         bool
	}{
		{6, 1, 10, 2, false},                     // 6/1 vs 10/2: 5 is lighter, keep it
		{4, 2, 2, 1, false},                      // exact tie: keep the earlier
		{7000000, 900, 8000000, 1000, true},      // the needs_64bit vector: 7777.7 < 8000
		{1 << 40, 65535, 1<<40 + 1, 65535, true}, // products near 2^56
		{1 << 40, 65534, 1 << 40, 65535, false},  // same count, lighter weight loses
		{0, 1, 0, 65535, false},                  // both idle: keep the earlier
		{1, 65535, 1, 1, true},
	} {
		if got := lighter(c.o, c.w, c.bo, c.bw); got != c.want {
			t.Errorf("lighter(%d/%d than %d/%d) = %v; want %v", c.o, c.w, c.bo, c.bw, got, c.want)
		}
	}
}

// TestMaxConns: a target at MaxConns is not eligible for any scheduler;
// a slot coming free makes it eligible again at the next pick.
func TestMaxConns(t *testing.T) {
	for _, name := range Names {
		t.Run(string(name), func(t *testing.T) {
			ts := weighted(1, 1)
			ts[0].MaxConns, ts[1].MaxConns = 1, 2
			p, _ := New(name, ts, nil, Options{})
			ts[0].B.Acquire(1)
			for k := range 20 {
				var r Request
				r.Client = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(k)}), 1000)
				if i, err := p.Pick(&r); i != 1 || err != nil {
					t.Fatalf("Pick with A full = %d, %v; want 1 (B)", i, err)
				}
			}
			ts[1].B.Acquire(2)
			ts[1].B.Acquire(2)
			var r Request
			if i, err := p.Pick(&r); err != ErrNoBackend {
				t.Fatalf("Pick with both full = %d, %v; want ErrNoBackend", i, err)
			}
			ts[0].B.Release()
			if i, err := p.Pick(&r); i != 0 || err != nil {
				t.Fatalf("Pick after A freed a slot = %d, %v; want 0 (A)", i, err)
			}
		})
	}
}

func TestNoBackend(t *testing.T) {
	for _, name := range Names {
		t.Run(string(name), func(t *testing.T) {
			for _, ts := range [][]Target{nil, targets([]vecBackend{{Name: "A"}, {Name: "B"}})} {
				p, err := New(name, ts, nil, Options{})
				if err != nil {
					t.Fatal(err)
				}
				var r Request
				if i, err := p.Pick(&r); err != ErrNoBackend {
					t.Errorf("Pick over %d targets, weight 0 = %d, %v; want ErrNoBackend", len(ts), i, err)
				}
			}
			ts := targets([]vecBackend{{Name: "A", Weight: 1}, {Name: "B", Weight: 1}})
			p, _ := New(name, ts, nil, Options{})
			var r Request
			a, _ := p.Pick(&r)
			r.MarkTried(a)
			b, err := p.Pick(&r)
			r.MarkTried(b)
			if err != nil || a == b {
				t.Errorf("second pick = %d, %v; want the other backend than %d", b, err, a)
			}
			if i, err := p.Pick(&r); err != ErrNoBackend {
				t.Errorf("third pick = %d, %v; want ErrNoBackend once both are tried", i, err)
			}
		})
	}
	if _, err := New("nope", nil, nil, Options{}); err == nil {
		t.Error("New(nope) succeeded")
	}
}

func itoa(n int) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}

// TestNamesBuild: every name sched.Names lists (the list conf offers)
// builds a scheduler, and every hash key is accepted.
func TestNamesBuild(t *testing.T) {
	for _, n := range Names {
		if _, err := New(n, nil, nil, Options{}); err != nil {
			t.Errorf("New(%q): %v", n, err)
		}
	}
	for _, k := range HashKeys {
		if _, err := New("sh", nil, nil, Options{HashKey: k}); err != nil {
			t.Errorf("hash_key %q: %v", k, err)
		}
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{65537, true}, {65536, false}, {1, false}, {MaxTableSize, true}, {MaxTableSize + 2, false}} {
		if err := CheckTableSize(c.n); (err == nil) != c.ok {
			t.Errorf("CheckTableSize(%d) = %v; want ok %v", c.n, err, c.ok)
		}
	}
	if err := CheckBackends("mh", Options{TableSize: 7}, 7); err == nil {
		t.Error("CheckBackends accepted an mh table no larger than the backends")
	}
}
