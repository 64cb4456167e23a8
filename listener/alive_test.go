package listener

import (
	"fmt"
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
		testkit.WaitFor(t, 10*time.Second, func() error {
			if p.srv.Alive(maxAge) != want {
				return fmt.Errorf("Alive stayed %v; want %v", !want, want)
			}
			return nil
		})
	}
	await(true)
	freeze <- struct{}{} // the loop blocks at its next iteration, within a heartbeat
	await(false)
	close(thaw)
	await(true)
}
