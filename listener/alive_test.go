package listener

import (
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestFrozenAcceptLoopNotAlive: Alive, which the watchdog ping depends on,
// turns false when an accept loop stops answering its heartbeat, and true
// again when it answers.
func TestFrozenAcceptLoopNotAlive(t *testing.T) {
	testkit.CheckLeaks(t)
	freeze := make(chan struct{}, 1)
	thaw := make(chan struct{})
	p := startProxy(t, "rr", []testBackend{{"a", testkit.DeadAddr(t), 1}}, nil, 0, func(s *Server) {
		s.acceptHook = func() {
			select {
			case <-freeze:
				<-thaw
			default:
			}
		}
		s.SetHeartbeat(50 * time.Millisecond)
	})
	const maxAge = 500 * time.Millisecond
	await := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); p.srv.Alive(maxAge) != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("Alive stayed %v for 10 s; want %v", !want, want)
			}
		}
	}
	await(true)
	freeze <- struct{}{} // the loop blocks at its next iteration, within a heartbeat
	await(false)
	close(thaw)
	await(true)
}
