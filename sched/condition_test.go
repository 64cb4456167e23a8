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
