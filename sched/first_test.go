package sched

import (
	"slices"
	"testing"
	"time"
)

// TestFirst: every pick goes to the first eligible target in order,
// whatever the weights; a full target spills to the next; a down or
// weight-0 one is passed over; and picking allocates nothing.
func TestFirst(t *testing.T) {
	ts := weighted(1, 5, 1)
	p, err := New("first", ts, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := picks(p, ts, 6); !slices.Equal(got, []string{"A", "A", "A", "A", "A", "A"}) {
		t.Errorf("picks = %v; want A every time", got)
	}
	ts[0].MaxConns = 2
	ts[0].B.Acquire(2)
	ts[0].B.Acquire(2)
	if got := picks(p, ts, 3); !slices.Equal(got, []string{"B", "B", "B"}) {
		t.Errorf("picks with A full = %v; want B (spill)", got)
	}
	ts[0].B.Release()
	if got := picks(p, ts, 1); got[0] != "A" {
		t.Errorf("pick once A has a free slot = %v; want A", got)
	}
	ts[0].B.PassiveFail(1, time.Hour, time.Now())
	if got := picks(p, ts, 1); got[0] != "B" {
		t.Errorf("pick with A down = %v; want B", got)
	}
	ts[1].Weight = 0
	if got := picks(p, ts, 1); got[0] != "C" {
		t.Errorf("pick with A down, B weight 0 = %v; want C", got)
	}
	var r Request
	if n := testing.AllocsPerRun(100, func() { p.Pick(&r) }); n != 0 {
		t.Errorf("Pick allocates %v times; want 0", n)
	}
}

// TestFirstWriter: with a writer, first picks it while it is eligible,
// even with the list's first target eligible; a writer down, full or tried
// gives way to the list order; an unknown writer is none; and picking
// allocates nothing.
func TestFirstWriter(t *testing.T) {
	ts := weighted(1, 1, 1)
	p, err := New("first", ts, nil, Options{Writer: "B"})
	if err != nil {
		t.Fatal(err)
	}
	if got := picks(p, ts, 4); !slices.Equal(got, []string{"B", "B", "B", "B"}) {
		t.Errorf("picks with writer B = %v; want B every time", got)
	}
	var r Request
	if n := testing.AllocsPerRun(100, func() { p.Pick(&r) }); n != 0 {
		t.Errorf("Pick allocates %v times; want 0", n)
	}
	r.MarkTried(1)
	if i, _ := p.Pick(&r); i != 0 {
		t.Errorf("pick with B tried = %d; want 0 (A, the list order)", i)
	}
	ts[1].B.PassiveFail(1, time.Hour, time.Now())
	if got := picks(p, ts, 2); !slices.Equal(got, []string{"A", "A"}) {
		t.Errorf("picks with writer B down = %v; want A (the list order)", got)
	}
	q, _ := New("first", ts, nil, Options{Writer: "nobody"})
	if got := picks(q, ts, 1); got[0] != "A" {
		t.Errorf("pick with an unknown writer = %v; want A", got)
	}
}
