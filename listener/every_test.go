package listener

import (
	"testing"
	"time"
)

// TestEvery: the first line goes through, the next ones within the
// interval are held back and counted, and the first after it reports them.
func TestEvery(t *testing.T) {
	e := every{Interval: time.Hour}
	if n, ok := e.Allow(); !ok || n != 0 {
		t.Fatalf("first Allow = %d, %v; want 0, true", n, ok)
	}
	for range 5 {
		if _, ok := e.Allow(); ok {
			t.Fatal("Allow within the interval let a line through")
		}
	}
	e.last.Store(time.Now().Add(-2 * time.Hour).UnixNano()) // the interval passed
	if n, ok := e.Allow(); !ok || n != 5 {
		t.Fatalf("Allow after the interval = %d, %v; want 5 held back, true", n, ok)
	}
}
