package status

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/listener"
	"fulcrum/sched"
)

// snapOf is a Source's Snapshot func for table t, with no policies.
func snapOf(t *sched.Table) func() *listener.Snapshot {
	s := listener.NewSnapshot(t, nil)
	return func() *listener.Snapshot { return s }
}

// table builds a one-service table over backends with weights.
func table(t *testing.T, bs []*backend.Backend, weights []int) *sched.Table {
	t.Helper()
	var ts []sched.Target
	for i, b := range bs {
		ts = append(ts, sched.Target{B: b, Addr: netip.MustParseAddrPort("127.0.0.1:1"), Weight: weights[i], Base: weights[i]})
	}
	p, err := sched.New("rr", ts, nil, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc := &sched.Service{Name: "s", Scheduler: "rr", Targets: ts, Picker: p}
	return sched.NewTable(3, []*sched.Service{svc}, nil)
}

// TestOf: every view's state comes from sched.Service.Condition; a removed
// backend still draining is listed under its service with its deadline,
// and the STATUS= line counts it apart.
func TestOf(t *testing.T) {
	up, zero, held, gone := backend.New("s", "up"), backend.New("s", "zero"), backend.New("s", "held"), backend.New("s", "gone")
	held.SetOverride(backend.Maint, "test", time.Now())
	gone.Acquire(0) // one session still open
	gone.StopNew()
	deadline := time.Now().Add(time.Minute)
	tbl := table(t, []*backend.Backend{up, zero, held}, []int{1, 0, 1})
	st := Of(Source{Snapshot: snapOf(tbl),
		Draining: func() []Drain {
			return []Drain{{B: gone, Addr: netip.MustParseAddrPort("127.0.0.1:2"), Deadline: deadline}}
		}})
	want := map[string]struct {
		state, cause string
		up           bool
	}{
		"up":   {"up", "", true},
		"zero": {"draining", "weight 0", false},
		"held": {"maint", "set maint", false},
		"gone": {"draining", "removed", false},
	}
	if len(st.Services) != 1 || len(st.Services[0].Backends) != 4 {
		t.Fatalf("services %+v; want s with 4 backends", st.Services)
	}
	for _, b := range st.Services[0].Backends {
		w := want[b.Name]
		if b.State != w.state || b.Cause != w.cause || b.Up() != w.up {
			t.Errorf("%s: %s (%s), up %v; want %s (%s), up %v", b.Name, b.State, b.Cause, b.Up(), w.state, w.cause, w.up)
		}
		if b.Name == "gone" && (!b.Removed || b.Active != 1 || !b.DrainDeadline.Equal(deadline)) {
			t.Errorf("gone: %+v; want removed, 1 active, the deadline", b)
		}
		if b.Name == "held" && (b.Override != "maint" || b.Weight != 0 || b.Configured != 1) {
			t.Errorf("held: override %q weight %d/%d; want maint 0/1", b.Override, b.Weight, b.Configured)
		}
	}
	if line := st.Line(); line != "generation 3; 1 services; backends 1/3 up; 1 connections; 1 removed backends draining" {
		t.Errorf("Line() = %q", line)
	}
	// A removed service's draining backend is still listed, by service.
	st = Of(Source{Snapshot: snapOf(sched.NewTable(4, nil, nil)),
		Draining: func() []Drain { return []Drain{{B: gone}} }})
	if len(st.Services) != 1 || st.Services[0].Name != "s" || !strings.Contains(st.Line(), "1 removed backends draining") {
		t.Errorf("removed service: %+v, %q", st.Services, st.Line())
	}
}

// TestOfStopping: at shutdown every backend drains while still in the
// table; it says stopping, not removed.
func TestOfStopping(t *testing.T) {
	b := backend.New("s", "a")
	b.StopNew()
	tbl := table(t, []*backend.Backend{b}, []int{1})
	st := Of(Source{Snapshot: snapOf(tbl), Draining: func() []Drain { return []Drain{{B: b}} }})
	if got := st.Services[0].Backends; len(got) != 1 || got[0].State != "draining" || got[0].Cause != "stopping" || got[0].Removed {
		t.Errorf("backends at shutdown %+v; want one, draining (stopping)", got)
	}
}

// TestOfMaxConns: a service's max_conns, which the listener's policy
// holds, is in its status beside its connections (and absent without one).
func TestOfMaxConns(t *testing.T) {
	tbl := table(t, []*backend.Backend{backend.New("s", "a")}, []int{1})
	snap := listener.NewSnapshot(tbl, map[string]*listener.Policy{"s": {MaxConns: 100}})
	st := Of(Source{Snapshot: func() *listener.Snapshot { return snap }})
	if got := st.Services[0].MaxConns; got != 100 {
		t.Errorf("service s max_conns %d; want 100", got)
	}
	js, err := json.Marshal(st.Services[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"max_conns":100`) {
		t.Errorf("service s as JSON %s; want \"max_conns\":100", js)
	}
	if st := Of(Source{Snapshot: snapOf(tbl)}); st.Services[0].MaxConns != 0 {
		t.Errorf("without a limit: max_conns %d; want 0", st.Services[0].MaxConns)
	}
}
