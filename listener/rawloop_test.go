package listener

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestBusyLoopLeavesAP: a loop that blocks in its own epoll_wait holds its
// P while busy, so the Server keeps a P for everything else, even in a
// process given one (GOMAXPROCS=1, as the pinned bench runs fulcrum):
// while the only loop is busy, new connections are accepted and served, a
// timer fires and other goroutines run. Once the traffic stops, the loop
// gives its P back.
func TestBusyLoopLeavesAP(t *testing.T) {
	testkit.CheckLeaks(t)
	orig := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(max(orig, int(rawSlots.max.Load())+1)) })
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))

	busy := p.dial(t)
	busy.SetDeadline(time.Now().Add(20 * time.Second))
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // exits when stop is closed, at an error, or after 200,000 round trips
		buf := make([]byte, 64)
		for range 200_000 {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := busy.Write(buf); err != nil {
				done <- err
				return
			}
			if _, err := io.ReadFull(busy, buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	if procs := runtime.GOMAXPROCS(0); procs < 2 {
		t.Fatalf("GOMAXPROCS = %d with one loop; want at least 2: a busy loop holds its P", procs)
	}
	testkit.WaitFor(t, 10*time.Second, func() error {
		if rawSlots.held.Load() == 0 {
			return errors.New("the busy loop never held its P in a raw wait")
		}
		return nil
	})
	if held, most := rawSlots.held.Load(), rawSlots.max.Load(); held > most || int(most) >= runtime.GOMAXPROCS(0) {
		t.Fatalf("%d loops hold a P, at most %d, of GOMAXPROCS %d: no P left for the rest", held, most, runtime.GOMAXPROCS(0))
	}

	fired := make(chan struct{})
	time.AfterFunc(time.Millisecond, func() { close(fired) })
	ping, pong := make(chan int), make(chan int)
	go func() { // exits after 1,000 exchanges
		for range 1000 {
			pong <- <-ping + 1
		}
	}()
	for i := range 1000 {
		ping <- i
		if <-pong != i+1 {
			t.Fatal("ping-pong out of order")
		}
	}
	for i := range 20 { // accept, dial and serve, while the loop is busy
		c := p.dial(t)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != byte(i) {
			t.Fatalf("connection %d while the loop is busy: %v %v", i, b, err)
		}
		c.Close()
	}
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a 1 ms timer did not fire within 10 s while the loop was busy")
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("the busy connection: %v", err)
	}
	busy.Close()
	if err := testkit.Until(10*time.Second, func() error {
		if n := rawSlots.held.Load(); n != 0 {
			return fmt.Errorf("%d loops still hold a P 10 s after the traffic stopped", n)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	p.settle(t, 0)
	p.waitReturns(t)
}
