package backend

import (
	"testing"
	"time"
)

// TestHold: Kick wakes every waiting connection and empties the queue; a
// wait without a kick ends at its deadline; Leave is safe either way.
func TestHold(t *testing.T) {
	g := newGroup("s")
	hs := []*Hold{g.Hold(), g.Hold(), g.Hold()}
	if n := g.HoldStats().Holding; n != 3 {
		t.Fatalf("Holding = %d; want 3", n)
	}
	hs[1].Leave()
	g.Kick()
	for i, h := range []*Hold{hs[0], hs[2]} {
		if !h.Wait(time.Now().Add(time.Minute)) {
			t.Errorf("hold %d not woken by Kick", i)
		}
		h.Leave()
	}
	if n := g.HoldStats().Holding; n != 0 {
		t.Errorf("Holding after Kick = %d; want 0", n)
	}
	h := g.Hold()
	if h.Wait(time.Now().Add(10 * time.Millisecond)) {
		t.Error("a wait without a kick reported a kick")
	}
	h.Leave()
	if n := g.HoldStats().Holding; n != 0 {
		t.Errorf("Holding after Leave = %d; want 0", n)
	}
}
