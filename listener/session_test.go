package listener

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/backend"
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
			p.svc.Targets[0].B.Cut(backend.CutDown)
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

// TestErrorEndsBoth (S5): an error in one direction ends the session, the
// other direction too, whatever it holds or waits for (design.md; nginx's
// stream proxy ends both on an error of either). The case that decides
// it: a client resets while its backend, a database between queries,
// sends nothing; the direction towards the client has nothing to deliver
// and would otherwise wait for the backend for ever. The backend sees its
// connection end at once, not at an idle timeout.
func TestErrorEndsBoth(t *testing.T) {
	testkit.CheckLeaks(t)
	ended := make(chan error, 1)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		c.Write([]byte("ready"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.Copy(io.Discard, c) // a backend between queries: it only waits
		ended <- err
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.IdleTimeout = time.Hour })
	c := p.dial(t)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	c.SetLinger(0)
	c.Close() // RST
	select {
	case err := <-ended:
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the backend's connection did not end within 10 s of the client's reset")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the backend's handler did not return")
	}
	if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != endReset {
		t.Errorf("access line %v; want end %q", line, endReset)
	}
	p.settle(t, 0)
}
