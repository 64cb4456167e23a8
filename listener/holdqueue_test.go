package listener

import (
	"testing"
	"time"
)

// TestHoldQueue: kick wakes every waiting connection and empties the
// queue; a wait without a kick ends at its deadline; leave is safe either
// way.
func TestHoldQueue(t *testing.T) {
	g := newAdmission("s")
	hs := []*hold{g.join(), g.join(), g.join()}
	if n := g.stats().Holding; n != 3 {
		t.Fatalf("Holding = %d; want 3", n)
	}
	hs[1].leave()
	g.kick()
	for i, h := range []*hold{hs[0], hs[2]} {
		if !h.wait(time.Now().Add(time.Minute)) {
			t.Errorf("hold %d not woken by kick", i)
		}
		h.leave()
	}
	if n := g.stats().Holding; n != 0 {
		t.Errorf("Holding after kick = %d; want 0", n)
	}
	h := g.join()
	if h.wait(time.Now().Add(10 * time.Millisecond)) {
		t.Error("a wait without a kick reported a kick")
	}
	h.leave()
	if n := g.stats().Holding; n != 0 {
		t.Errorf("Holding after leave = %d; want 0", n)
	}
}
