//go:build fulcrumseam

package listener

import (
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// await waits for ch, at most 10 s, failing with what did not happen.
func awaitSeam(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("within 10 s: %s", what)
	}
}

// closeInBackground runs Close in a goroutine (which exits when Close
// returns) and returns a channel closed then.
func closeInBackground(p *testProxy) <-chan struct{} {
	closed := make(chan struct{})
	go func() { p.srv.Close(); close(closed) }()
	return closed
}

// retireRace stops p's only loop once at seam point at, as it accepts
// from the listening socket, after arm; at says it stopped there, waiting
// that a retired socket's accept goroutine waits for its owner, and
// closing release lets the loop go on.
func retireRace(t *testing.T, p *testProxy, point seamPoint) (arm func(), at, waiting <-chan struct{}, release chan struct{}) {
	t.Helper()
	awaitParked(t, p)
	var armed atomic.Bool
	atc, waitc, release := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	setSeam(t, func(sp seamPoint, _ *session) error {
		switch sp {
		case point:
			if armed.CompareAndSwap(true, false) {
				atc <- struct{}{}
				<-release
			}
		case seamAcceptWaitOwner:
			select {
			case waitc <- struct{}{}:
			default:
			}
		}
		return nil
	})
	return func() { armed.Store(true) }, atc, waitc, release
}

// TestRetireWhileLoopParks: a loop finds the listening socket's queue
// empty and, before it parks the socket, the socket is retired; the accept
// goroutine, finding it owned, waits for the loop to hand it over. The
// loop then parks it, and must see the retirement and hand it over all the
// same, or Close waits for ever.
func TestRetireWhileLoopParks(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))
	arm, atEmpty, waiting, release := retireRace(t, p, seamAcceptEmpty)
	arm()
	c := p.dial(t) // the loop accepts it, finds the queue empty and stops before parking
	awaitSeam(t, atEmpty, "the loop never found the queue empty")
	closed := closeInBackground(p)
	awaitSeam(t, waiting, "the accept goroutine never waited for the loop that owns the socket")
	close(release)
	awaitSeam(t, closed, "Close did not return: the accept goroutine waits for a loop that parked the socket")
	if err := echoOnce(c, 'x'); err != nil {
		t.Fatalf("the connection accepted before the retirement: %v", err)
	}
	if d, err := net.DialTimeout("tcp", p.addr, 5*time.Second); err == nil {
		d.Close()
		t.Fatal("a connection to the retired socket was accepted: it is still open")
	}
	c.Close()
	p.settle(t, 0)
	p.waitReturns(t)
}

// TestRetireWhileLoopAccepts: the socket is retired while a loop owns it,
// about to accept. Its accept goroutine waits for the loop (Close does not
// return meanwhile: the loop still uses the descriptor), and the loop,
// once it goes on, serves what it accepts and hands the socket over.
func TestRetireWhileLoopAccepts(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))
	arm, atAccept, waiting, release := retireRace(t, p, seamLoopAccept)
	arm()
	c := p.dial(t)
	awaitSeam(t, atAccept, "the loop never came to accept")
	closed := closeInBackground(p)
	awaitSeam(t, waiting, "the accept goroutine never waited for the loop that owns the socket")
	select {
	case <-closed:
		t.Fatal("Close returned while a loop still owned the socket, about to accept from its descriptor")
	default:
	}
	close(release)
	awaitSeam(t, closed, "Close did not return after the loop went on")
	if err := echoOnce(c, 'y'); err != nil {
		t.Fatalf("the connection the loop accepted as the socket was retired: %v", err)
	}
	c.Close()
	p.settle(t, 0)
	p.waitReturns(t)
}

// TestLoopAcceptErrorHandedOver: an accept in a loop fails (ECONNABORTED,
// say). The loop does not back off, which would stall its sessions: it
// hands the socket to its accept goroutine, which counts the error, logs
// it, backs off and accepts the connection still queued.
func TestLoopAcceptErrorHandedOver(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))
	awaitParked(t, p)
	var armed atomic.Bool
	setSeam(t, func(at seamPoint, _ *session) error {
		if at == seamLoopAccept && armed.CompareAndSwap(true, false) {
			return os.NewSyscallError("accept4", unix.ECONNABORTED)
		}
		return nil
	})
	armed.Store(true)
	c := p.dial(t)
	if err := echoOnce(c, 'z'); err != nil {
		t.Fatalf("the connection queued behind the failed accept: %v", err)
	}
	if armed.Load() {
		t.Fatal("the loop never accepted: the error was not injected")
	}
	p.logs.Wait(t, 10*time.Second, "accept failed", func(m map[string]any) bool { return m["message"] == "accept failed" })
	if st := p.srv.Sockets(); len(st) != 1 || st[0].AcceptErrors != 1 {
		t.Errorf("Sockets() = %+v; want one socket with 1 accept error", st)
	}
	c.Close()
	p.settle(t, 0)
	p.waitReturns(t)
}
