package backend

import (
	"errors"
	"testing"
	"time"
)

// TestCondition: the one availability rule, in the order it applies.
func TestCondition(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		setup func(b *Backend)
		base  int
		want  State
		cause string
		takes bool
	}{
		{"up", func(*Backend) {}, 1, StateUp, "", true},
		{"weight 0", func(*Backend) {}, 0, StateDraining, "weight 0", true},
		{"check down", func(b *Backend) { b.checked(errors.New("refused"), false, 1, 1, now) }, 1, StateDown, "check", false},
		{"down at weight 0", func(b *Backend) { b.checked(errors.New("refused"), false, 1, 1, now) }, 0, StateDown, "check", false},
		{"removed", func(b *Backend) { b.StopNew() }, 1, StateDraining, "removed", false},
		{"set drain", func(b *Backend) { b.SetOverride(Drain, "test", now) }, 1, StateDraining, "set drain", false},
		{"set maint over down", func(b *Backend) {
			b.checked(errors.New("refused"), false, 1, 1, now)
			b.SetOverride(Maint, "test", now)
		}, 1, StateMaint, "set maint", false},
		{"ready again", func(b *Backend) {
			b.SetOverride(Maint, "test", now)
			b.SetOverride(Ready, "test", now)
		}, 1, StateUp, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New("svc", "b")
			tc.setup(b)
			c := b.Condition(tc.base)
			if c.State != tc.want || c.Cause != tc.cause {
				t.Errorf("Condition(%d) = %v (%q); want %v (%q)", tc.base, c.State, c.Cause, tc.want, tc.cause)
			}
			if b.Takes() != tc.takes {
				t.Errorf("Takes() = %v; want %v", b.Takes(), tc.takes)
			}
			if got := b.Acquire(0); got != tc.takes && tc.cause != "check" {
				t.Errorf("Acquire = %v; want %v", got, tc.takes)
			}
		})
	}
}

// TestCheckStats: each result is counted and timed; the histogram is
// cumulative and its count is every check.
func TestCheckStats(t *testing.T) {
	b := New("svc", "b")
	b.checks.record(time.Now(), 2*time.Millisecond, nil)
	b.checks.record(time.Now(), 20*time.Second, errors.New("tcp check timed out after 1s"))
	s := b.Checks()
	if s.OK != 1 || s.Failed != 1 || s.Count != 2 {
		t.Errorf("ok %d failed %d count %d; want 1 1 2", s.OK, s.Failed, s.Count)
	}
	if s.Counts[0] != 0 || s.Counts[1] != 1 || s.Counts[len(s.Counts)-1] != 1 {
		t.Errorf("buckets %v; want the 2ms check from the 2.5ms bound on, the 20s one in none", s.Counts)
	}
	if s.Last.Err == "" || s.Last.Latency != 20*time.Second {
		t.Errorf("last = %+v; want the failed 20s check", s.Last)
	}
}
