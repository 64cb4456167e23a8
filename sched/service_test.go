package sched

import (
	"testing"
	"time"

	"fulcrum/backend"
)

// TestConditionNamesUp: Service.Condition says up exactly when Target.Up
// does, whatever keeps a target from new connections, so that status
// views count what the schedulers pick from.
func TestConditionNamesUp(t *testing.T) {
	now := time.Now()
	down := backend.New("s", "down")
	down.StartDown("test: down")
	maint, drain, removed := backend.New("s", "maint"), backend.New("s", "drain"), backend.New("s", "removed")
	maint.SetOverride(backend.Maint, "test", now)
	drain.SetOverride(backend.Drain, "test", now)
	removed.StopNew()
	for _, c := range []struct {
		name  string
		t     Target
		split []string
		state backend.State
		cause string
	}{
		{"up", Target{B: backend.New("s", "up"), Weight: 1, Base: 1}, nil, backend.StateUp, ""},
		{"slow start", Target{B: backend.New("s", "ramp"), Weight: 1, Base: 10}, nil, backend.StateUp, ""},
		{"down", Target{B: down, Weight: 0, Base: 1}, nil, backend.StateDown, "check"},
		{"down since the table", Target{B: down, Weight: 1, Base: 1}, nil, backend.StateDown, "check"},
		{"maint", Target{B: maint, Weight: 0, Base: 1}, nil, backend.StateMaint, "set maint"},
		{"drain", Target{B: drain, Weight: 0, Base: 1}, nil, backend.StateDraining, "set drain"},
		{"removed", Target{B: removed, Weight: 1, Base: 1}, nil, backend.StateDraining, "removed"},
		{"weight 0", Target{B: backend.New("s", "zero"), Weight: 0, Base: 0}, nil, backend.StateDraining, "weight 0"},
		{"up since the table", Target{B: backend.New("s", "late"), Weight: 0, Base: 1}, nil, backend.StateDraining, "weight 0"},
		{"split brain", Target{B: backend.New("s", "claimant"), Weight: 0, Base: 1}, []string{"claimant", "other"}, backend.StateDraining, "split brain"},
	} {
		s := &Service{Name: "s", SplitBrain: c.split}
		got := s.Condition(&c.t)
		if got.State != c.state || got.Cause != c.cause {
			t.Errorf("%s: Condition = %s (%s); want %s (%s)", c.name, got.State, got.Cause, c.state, c.cause)
		}
		if (got.State == backend.StateUp) != c.t.Up() {
			t.Errorf("%s: Condition says %s, Up says %v", c.name, got.State, c.t.Up())
		}
	}
}

// TestServing: a new connection picks from the service's own pool
// (primaries, or backups while no primary is up) while one of it is up,
// else from the first fallback along the chain that has one up, else from
// nowhere; fullness does not fall back.
func TestServing(t *testing.T) {
	down := func(name string) *backend.Backend {
		b := backend.New("s", name)
		b.StartDown("test: down")
		return b
	}
	full := backend.New("a", "full")
	full.Acquire(0)
	svc := func(name string, prim, back []*backend.Backend, fb *Service) *Service {
		s := &Service{Name: name, Fallback: fb}
		for _, b := range prim {
			s.Targets = append(s.Targets, Target{B: b, Weight: 1, Base: 1, MaxConns: 1})
		}
		for _, b := range back {
			s.Backups = append(s.Backups, Target{B: b, Weight: 1, Base: 1})
		}
		var err error
		if s.Picker, err = New("rr", s.Targets, nil, Options{}); err != nil {
			t.Fatal(err)
		}
		if len(s.Backups) > 0 {
			s.BackupPicker, _ = New("rr", s.Backups, nil, Options{})
		}
		return s
	}
	last := svc("last", []*backend.Backend{backend.New("last", "z")}, nil, nil)
	mid := svc("mid", []*backend.Backend{down("y")}, nil, last)
	for _, c := range []struct {
		name   string
		s      *Service
		from   string // "": nowhere
		target string // the first target of the pool returned
	}{
		{"own", svc("a", []*backend.Backend{backend.New("a", "x")}, nil, mid), "a", "x"},
		{"own but full", svc("a", []*backend.Backend{full}, nil, mid), "a", "full"},
		{"backups", svc("a", []*backend.Backend{down("x")}, []*backend.Backend{backend.New("a", "b")}, mid), "a", "b"},
		{"fallback's fallback", svc("a", []*backend.Backend{down("x")}, nil, mid), "last", "z"},
		{"nowhere", svc("a", []*backend.Backend{down("x")}, nil, svc("f", []*backend.Backend{down("w")}, nil, nil)), "", "x"},
	} {
		from, ts, p := c.s.Serving()
		name := ""
		if from != nil {
			name = from.Name
		}
		if name != c.from || len(ts) == 0 || ts[0].B.Name != c.target || p == nil {
			t.Errorf("%s: Serving() = %q, first target %s; want %q, %s", c.name, name, ts[0].B.Name, c.from, c.target)
		}
	}
}
