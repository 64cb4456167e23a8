package health

import (
	"testing"
	"time"
)

// TestWALClock: a replica's lag is how long ago the primary was where the
// replica has replayed to. Caught up with the primary's last position it
// is 0, however long the primary has been idle; stuck while the primary
// moves on, it grows with the clock; between two positions it is
// interpolated. A higher timeline starts the clock again and a lower one
// is not recorded; a primary not seen lately measures nothing.
func TestWALClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var c WALClock
	const fresh = time.Hour
	if _, known := c.Lag(at(0), 100, fresh); known {
		t.Fatal("a clock with no primary knows a lag")
	}
	var nilClock *WALClock
	nilClock.Primary(at(0), 1, 100) // records nothing, and does not panic
	if _, known := nilClock.Lag(at(0), 100, fresh); known {
		t.Fatal("a nil clock knows a lag")
	}

	c.Primary(at(0), 1, 100)
	c.Primary(at(60), 1, 100) // idle for a minute
	want := func(now float64, pos uint64, lag time.Duration) {
		t.Helper()
		if got, known := c.Lag(at(now), pos, fresh); !known || got != lag {
			t.Errorf("Lag(%v, %d) = %v, %v; want %v", now, pos, got, known, lag)
		}
	}
	want(61, 100, 0) // caught up with an idle primary: no lag
	c.Primary(at(62), 1, 200)
	c.Primary(at(63), 1, 300)
	want(63.5, 300, 0)
	want(64, 100, 4*time.Second)         // still where the primary was until 60 s: the stream went silent
	want(64, 150, 3*time.Second)         // halfway from 100 (last seen at 60) to 200 (first seen at 62): at 61
	want(64, 50, 64*time.Second)         // behind everything known: at least since the first mark
	c.Primary(at(63.2), 1, 250)          // another primary of the same timeline, behind: ignored
	want(64, 250, 1500*time.Millisecond) // between 200 (62) and 300 (63)

	c.Primary(at(70), 0, 1000) // a lower timeline: ignored
	want(70, 300, 0)
	c.Primary(at(70), 2, 310) // a promotion: a new history
	want(71, 310, 0)
	want(71, 305, 71*time.Second-70*time.Second)
	c.Primary(at(72), 1, 5000) // the old primary of a split brain: ignored
	want(72, 310, 0)
	// A primary not seen for longer than fresh (it died) measures nothing:
	// the replica's own view decides.
	if lag, known := c.Lag(at(80), 305, 5*time.Second); known {
		t.Errorf("10s after the primary's last check, with fresh 5s: lag %v, known", lag)
	}
}
