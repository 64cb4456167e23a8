package listener

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestAcceptorStates: who accepts from a listening socket is one owner at
// a time. A loop with an event for a parked socket becomes its owner; an
// event while it is owned marks it kicked, and the owner, finding the
// queue empty, may not park it then (it must accept again: a connection
// came behind the edge already taken); a retired socket takes no owner.
func TestAcceptorStates(t *testing.T) {
	a := &acceptor{own: make(chan struct{}, 1)}
	a.state.Store(stParked)
	if !a.kick() {
		t.Fatal("kick of a parked socket did not make the caller its owner")
	}
	if a.kick() {
		t.Fatal("kick of an owned socket made a second owner")
	}
	if got := a.state.Load(); got != stKicked {
		t.Fatalf("state %d after a kick of an owned socket; want kicked (%d)", got, stKicked)
	}
	if a.park() {
		t.Fatal("the owner parked a kicked socket: the connection behind the kick would wait for the next one")
	}
	if got := a.state.Load(); got != stRunning {
		t.Fatalf("state %d after a refused park; want running (%d), the owner's still", got, stRunning)
	}
	if !a.park() {
		t.Fatal("the owner could not park an unkicked socket")
	}
	if !a.kick() {
		t.Fatal("kick after a park did not make the caller the owner")
	}
	a.handOff(nil)
	select {
	case <-a.own:
	default:
		t.Fatal("handOff did not signal the accept goroutine")
	}
	if a.kick() || a.state.Load() != stKicked {
		t.Fatal("a socket handed to its goroutine took another owner")
	}
	a.state.Store(stDone)
	if a.kick() || a.state.Load() != stDone {
		t.Fatal("a retired socket took an owner")
	}
}

// acceptorOf returns p's one acceptor.
func acceptorOf(p *testProxy) *acceptor {
	p.srv.mu.Lock()
	defer p.srv.mu.Unlock()
	return p.srv.lns[p.key].a
}

// awaitParked waits until nobody owns p's listening socket: the accept
// goroutine's first drain is over, and the next connection's event makes
// a loop its owner.
func awaitParked(t *testing.T, p *testProxy) {
	t.Helper()
	a := acceptorOf(p)
	testkit.WaitFor(t, 10*time.Second, func() error {
		if s := a.state.Load(); s != stParked {
			return fmt.Errorf("listening socket in state %d; want parked", s)
		}
		return nil
	})
}

// echoOnce sends one byte on c and reads it back, within 10 s.
func echoOnce(c net.Conn, b byte) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{b}); err != nil {
		return err
	}
	got := make([]byte, 1)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if got[0] != b {
		return fmt.Errorf("echoed %q; want %q", got[0], b)
	}
	return nil
}

// TestLoopAcceptsQueueBeyondBatch: a loop accepts at most acceptBatch
// connections per wake-up; those left queued behind the edge it took are
// accepted after its next wait, with no new edge to wake it. Forty clients
// queue while the loop is held in its first accept; every one is served.
func TestLoopAcceptsQueueBeyondBatch(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	var armed atomic.Bool
	var once sync.Once
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1), func(s *Server) {
		s.acceptHook = func() {
			if armed.Load() {
				once.Do(func() { held <- struct{}{}; <-hold })
			}
		}
	})
	awaitParked(t, p)
	armed.Store(true)
	const n = 3*acceptBatch - 8
	conns := make([]*net.TCPConn, 0, n)
	conns = append(conns, p.dial(t)) // wakes the loop, which is held in its first accept
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop never came to accept")
	}
	for range n - 1 { // queued in the backlog meanwhile: one edge at most
		conns = append(conns, p.dial(t))
	}
	close(hold)
	for i, c := range conns {
		if err := echoOnce(c, byte(i)); err != nil {
			t.Fatalf("connection %d of %d, queued together: %v", i, n, err)
		}
		c.Close()
	}
	p.settle(t, 0)
	p.waitReturns(t)
}
