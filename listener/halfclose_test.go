package listener

import (
	"io"
	"net"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestHalfCloseTimeout: a client that sends its request and closes its
// write side, in front of a backend that never answers nor closes, is not
// kept for ever: half_close_timeout after the client's FIN (with no idle
// timeout at all) the session ends, logged as such. A backend that keeps
// answering slowly after the client's FIN is not cut.
func TestHalfCloseTimeout(t *testing.T) {
	testkit.CheckLeaks(t)
	const limit = 300 * time.Millisecond
	release := make(chan struct{})
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			return
		}
		if b[0] == 's' { // stuck: never answers, never closes, until the test ends
			<-release
			return
		}
		for range 6 { // slow: a byte every limit/3 for two limits, then close
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
			time.Sleep(limit / 3) // the traffic pattern under test, not synchronisation
		}
	})
	t.Cleanup(func() { close(release) }) // before the server's cleanup waits for its handlers
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.HalfCloseTimeout = limit })

	stuck := p.dial(t)
	stuck.Write([]byte{'s'})
	stuck.CloseWrite()
	start := time.Now()
	stuck.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(testkit.User(stuck)); isTimeout(err) {
		t.Fatal("a half-closed session with a stuck backend was not ended")
	}
	if el := time.Since(start); el < limit {
		t.Errorf("ended after %v; want at least %v", el, limit)
	}
	if line := p.logs.Wait(t, 5*time.Second, "access", isAccess); line["end"] != endHalfClose {
		t.Errorf("end = %v; want %q", line["end"], endHalfClose)
	}

	slow := p.dial(t)
	slow.Write([]byte{'w'})
	slow.CloseWrite()
	slow.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(testkit.User(slow))
	if err != nil || string(b) != "......" {
		t.Fatalf("slow answer after the client's FIN = %q, %v; want all six bytes", b, err)
	}
}
