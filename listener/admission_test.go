package listener

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkQueueRelease measures what one freed service slot costs with
// 1 and with 4,000 connections queued for a service with max_conns = 1: each
// release hands the slot to the next waiter, which holds it for 100µs (long
// enough for the others to go back to sleep, as in life) and releases it in
// turn. cpu-ns/release is the whole process's CPU per hand-over; with a
// wake-one queue it does not grow with the number of waiters.
func BenchmarkQueueRelease(b *testing.B) {
	for _, waiters := range []int{1, 4000} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) { benchQueue(b, waiters) })
	}
}

func benchQueue(b *testing.B, waiters int) {
	g := newAdmission("s")
	deadline := time.Now().Add(10 * time.Minute)
	benchHandOver(b, g, waiters, g.acquire, func() bool { return g.admit(1, deadline, 0, nil) }, g.release)
}

// benchHandOver runs waiters goroutines that each loop take, hold the slot
// 100µs, release, until b.N hand-overs are done; the slot is held (first)
// until all of them wait in g. It reports the process's CPU per hand-over.
func benchHandOver(b *testing.B, g *admission, waiters int, first func(int) bool, take func() bool, release func()) {
	var handed atomic.Int64
	total := int64(b.N)
	if !first(1) { // held until every waiter has queued
		b.Fatal("first Acquire failed")
	}
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() { // exits once b.N hand-overs are done, after one more turn
			defer wg.Done()
			for {
				if !take() {
					return
				}
				n := handed.Add(1)
				if n <= total {
					time.Sleep(100 * time.Microsecond) // a connection's life
				}
				release()
				if n >= total {
					return
				}
			}
		}()
	}
	testkit.WaitFor(b, 30*time.Second, func() error {
		if w := g.stats().Waiting; w < int64(waiters) {
			return fmt.Errorf("%d waiting; want %d", w, waiters)
		}
		return nil
	})
	b.ResetTimer()
	cpu0 := cpuTime()
	release()
	testkit.WaitFor(b, time.Minute, func() error { // the CPU is measured, not the polls' sleeps
		if n := handed.Load(); n < total {
			return fmt.Errorf("%d slots handed; want %d", n, total)
		}
		return nil
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/release")
	wg.Wait() // the rest take the slot once each and leave
}

// TestAdmitInArrivalOrder: freed service slots go to the waiters one at a
// time in the order they came, and a newcomer cannot take a slot while
// others wait.
func TestAdmitInArrivalOrder(t *testing.T) {
	g := newAdmission("s")
	if !g.acquire(1) {
		t.Fatal("first Acquire failed")
	}
	const n = 5
	order := make(chan int, n)
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	for i := range n {
		wg.Add(1)
		go func() { // exits once it has had the slot, or at the deadline
			defer wg.Done()
			if g.admit(1, deadline, 0, nil) {
				order <- i
			}
		}()
		testkit.WaitFor(t, 10*time.Second, func() error { // queued: the next one comes after it
			if st := g.stats(); st.Waiting != int64(i+1) {
				return fmt.Errorf("waiter %d did not queue: %+v", i, st)
			}
			return nil
		})
	}
	for i := range n {
		g.release()
		if g.acquire(1) {
			t.Fatalf("a newcomer took the slot released to waiter %d", i)
		}
		select {
		case got := <-order:
			if got != i {
				t.Fatalf("slot %d went to waiter %d; want %d (arrival order)", i, got, i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no waiter got slot %d", i)
		}
	}
	wg.Wait()
	if s := g.stats(); s.Waiting != 0 || s.Active != 1 {
		t.Errorf("after the queue: %+v; want 0 waiting, 1 active (the last waiter's)", s)
	}
}

// TestAdmitTimeout: a waiter whose deadline passes leaves the queue, and
// the next release does not go to it.
func TestAdmitTimeout(t *testing.T) {
	g := newAdmission("s")
	g.acquire(1)
	if g.admit(1, time.Now().Add(20*time.Millisecond), 0, nil) {
		t.Fatal("Admit took a slot that was held")
	}
	if s := g.stats(); s.Waiting != 0 || s.Queued != 1 {
		t.Errorf("after a timeout: %+v; want 0 waiting, 1 queued", s)
	}
	g.release()
	if !g.acquire(1) {
		t.Error("the released slot is lost")
	}
}

// TestBackendWakeOne: a freed backend slot wakes one waiter, the oldest; a
// waiter that cannot use it (it waits again) hands the wake on to the next
// while the slot is still free, and not once a newcomer has taken it.
func TestBackendWakeOne(t *testing.T) {
	var pool backend.Pool
	be, g := pool.Get("s", "x"), newAdmission("s")
	release := func() { be.Release(); g.freed(be) } // as lease.release does
	be.Acquire(1)
	deadline := time.Now().Add(10 * time.Second)
	a, b := g.enqueue(), g.enqueue()
	defer a.leave()
	defer b.leave()
	release()
	woken := make(chan string, 2)
	go func() { // exits after one wake or the deadline
		if b.wait(deadline) {
			woken <- "b"
		}
	}()
	if !a.wait(deadline) {
		t.Fatal("a, the oldest, was not woken")
	}
	select {
	case <-woken:
		t.Fatal("b was woken too by one freed slot")
	case <-time.After(50 * time.Millisecond):
	}
	if a.wait(time.Now().Add(10 * time.Millisecond)) { // a could not use it: handed on
		t.Error("a was woken again without a slot freed")
	}
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the wake a could not use never reached b")
	}

	// Taken by a newcomer before the woken waiter could: not handed on.
	c := g.enqueue()
	defer c.leave()
	be.Acquire(1)
	release() // wakes a, the oldest
	if !a.wait(deadline) {
		t.Fatal("a was not woken")
	}
	be.Acquire(1) // a newcomer takes the slot
	go func() {   // exits after one wake or the deadline
		if b.wait(time.Now().Add(time.Second)) {
			woken <- "b"
		}
	}()
	a.wait(time.Now().Add(10 * time.Millisecond)) // a waits again: the slot is taken, nothing to hand on
	select {
	case <-woken:
		t.Error("b was woken for a slot a newcomer had taken")
	case <-time.After(200 * time.Millisecond):
	}
}

// BenchmarkBackendQueueRelease is BenchmarkQueueRelease for a backend's
// max_conns, queued as the listener's connect does: a newcomer (here the
// connection that just released, coming back) tries before it queues, so a
// woken waiter may find its slot taken.
func BenchmarkBackendQueueRelease(b *testing.B) {
	for _, waiters := range []int{1, 4000} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) { benchBackendQueue(b, waiters) })
	}
}

func benchBackendQueue(b *testing.B, waiters int) {
	var pool backend.Pool
	be := pool.Get("s", "a")
	g := newAdmission("s")
	release := func() { be.Release(); g.freed(be) } // as lease.release does
	deadline := time.Now().Add(10 * time.Minute)
	take := func() bool { // a slot of be, queueing as connect does
		if be.Acquire(1) {
			return true
		}
		w := g.enqueue()
		defer w.leave()
		for !be.Acquire(1) {
			if !w.wait(deadline) {
				return false
			}
		}
		return true
	}
	benchHandOver(b, g, waiters, be.Acquire, take, release)
}
