package listener

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestCutDuringChurn (C2, with no seam): Cut, as on_down = "close" calls
// it, runs in a loop while clients come and go. A Cut that reaches a
// session between Track and begin must still end it: every client sees its
// connection end (by the Cut, or by the idle timeout), and Wait returns.
func TestCutDuringChurn(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.IdleTimeout = 300 * time.Millisecond })
	const clients, together = 1000, 16
	var stop atomic.Bool
	var cutter sync.WaitGroup
	cutter.Add(1)
	go func() { // exits when stop is set
		defer cutter.Done()
		for !stop.Load() {
			p.svc.Targets[0].B.Cut()
		}
	}()
	var wedged, failed atomic.Int32
	sem := make(chan struct{}, together)
	var wg sync.WaitGroup
	for range clients {
		sem <- struct{}{}
		wg.Add(1)
		go func() { // exits when its connection has ended, or 5 s passed
			defer func() { <-sem; wg.Done() }()
			c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
			if err != nil {
				failed.Add(1)
				return
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
				wedged.Add(1)
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	cutter.Wait()
	if n := wedged.Load(); n > 0 {
		t.Errorf("%d of %d sessions never ended (neither Cut nor the idle timeout ended them)", n, clients)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d clients could not connect", n, clients)
	}
	p.settle(t, 0)
	p.waitReturns(t)
	if n := len(p.logs.All(isAccess)); n != clients-int(failed.Load()) {
		t.Errorf("%d access lines; want %d", n, clients)
	}
}
