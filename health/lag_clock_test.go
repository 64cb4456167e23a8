package health

import (
	"testing"
	"time"
)

// TestClockLag: a replica is measured against the primary's recorded
// positions, and one behind all of them (another primary's numbering)
// is not measured at all; no clock measures nothing.
func TestClockLag(t *testing.T) {
	c := &WALClock{}
	now := time.Now()
	c.Primary(now.Add(-4*time.Second), 1, 100)
	c.Primary(now.Add(-2*time.Second), 1, 200)
	c.Primary(now, 1, 300)
	p := &Probe{MaxLag: 10 * time.Second, WAL: c}
	tests := []struct {
		pos   uint64
		known bool
		min   time.Duration
	}{
		{300, true, 0},
		{200, true, 2 * time.Second},
		{150, true, 3 * time.Second},
		{50, false, 0},
	}
	for _, tt := range tests {
		lag, known := p.clockLag(tt.pos)
		if known != tt.known || lag < tt.min || lag > tt.min+time.Second {
			t.Errorf("clockLag(%d) = %s, %v; want %v from %s", tt.pos, lag, known, tt.known, tt.min)
		}
	}
	if _, known := (&Probe{}).clockLag(300); known {
		t.Error("clockLag without a clock is known")
	}
}
