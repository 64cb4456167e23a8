package listener

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
	if !until(10*time.Second, func() bool { return rawSlots.held.Load() > 0 }) {
		t.Fatal("the busy loop never held its P in a raw wait")
	}
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
	if !until(10*time.Second, func() bool { return rawSlots.held.Load() == 0 }) {
		t.Errorf("%d loops still hold a P 10 s after the traffic stopped", rawSlots.held.Load())
	}
	p.settle(t, 0)
	p.waitReturns(t)
}

// BenchmarkRoundTrip: 64 B echoed through the proxy on one connection, one
// round trip at a time, with the epoll waits the loops make and the
// context switches of the process's threads per round trip (the runtime's
// own polls are not counted: strace -c -f or bench/run.sh's SYSCALLS pass
// give those).
func BenchmarkRoundTrip(b *testing.B) {
	be := testkit.NewServer(b, testkit.Echo)
	p := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel, withLoops(1))
	c := p.dial(b)
	buf := make([]byte, 64)
	rt := func() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	rt() // the session is up and its loop started
	lps := *p.srv.lps.Load()
	waits := func() (n uint64) {
		for _, lp := range lps {
			n += lp.waits.Load()
		}
		return n
	}
	w0, s0 := waits(), ctxSwitches(b)
	b.ResetTimer()
	for range b.N {
		rt()
	}
	b.StopTimer()
	b.ReportMetric(float64(waits()-w0)/float64(b.N), "loop-waits/op")
	b.ReportMetric(float64(ctxSwitches(b)-s0)/float64(b.N), "ctxsw/op")
}

// ctxSwitches is the context switches of every thread of the process.
func ctxSwitches(b *testing.B) (n int) {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				m, _ := strconv.Atoi(strings.TrimSpace(v))
				n += m
			}
		}
	}
	return n
}
