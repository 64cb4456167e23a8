package health

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

func TestEffectiveWeight(t *testing.T) {
	b := backend.New("s", "a")
	now := time.Now()
	if w := EffectiveWeight(10, 0, b, now); w != 10 {
		t.Errorf("up, no slow start: %d; want 10", w)
	}
	if w := EffectiveWeight(0, time.Minute, b, now); w != 0 {
		t.Errorf("base 0: %d; want 0", w)
	}
	// Down, then up: ramping from 10%.
	for range 3 {
		b.PassiveFail(3, time.Second, now)
	}
	if w := EffectiveWeight(10, 0, b, now); w != 0 {
		t.Errorf("down: %d; want 0", w)
	}
	b.ExpirePassive(now.Add(2 * time.Second))
	up := now.Add(2 * time.Second)
	for _, c := range []struct {
		after time.Duration
		want  int
	}{{0, 1}, {50 * time.Second, 6}, {100 * time.Second, 10}, {time.Hour, 10}} {
		if w := EffectiveWeight(10, 100*time.Second, b, up.Add(c.after)); w != c.want {
			t.Errorf("%v after coming up: weight %d; want %d", c.after, w, c.want)
		}
	}
}

// table is a one-service table over bs, with slow start ss.
func table(ss time.Duration, bs ...*backend.Backend) *sched.Table {
	svc := &sched.Service{Name: "s"}
	for _, b := range bs {
		svc.Targets = append(svc.Targets, sched.Target{B: b, Base: 1, Weight: 1, SlowStart: ss})
	}
	return sched.NewTable(1, []*sched.Service{svc}, nil)
}

// TestControllerChecks: a check that fails takes its backend down, the
// controller rebuilds and logs it under component health; a backend whose
// checks are turned off comes back up.
func TestControllerChecks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused

	pool := backend.Pool{}
	var tbl atomic.Pointer[sched.Table]
	var rebuilds atomic.Int64
	hc := New(zerolog.Nop(), tbl.Load, func() { rebuilds.Add(1) })
	pool.Changes = hc.Changes()
	b := pool.Get("s", "a")
	tbl.Store(table(0, b))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hc.Run(ctx); close(done) }() // exits at cancel
	defer func() { cancel(); <-done }()
	defer hc.Stop()

	spec := CheckSpec{Probe: Probe{Kind: "tcp", Addr: dead, Timeout: time.Second}, Interval: 20 * time.Millisecond, Rise: 1, Fall: 2}
	hc.SetChecks([]Job{{B: b, Spec: spec}})
	testkit.WaitFor(t, 10*time.Second, func() error { // the checks run on their own; no event but the result
		if down, n := b.Down(), rebuilds.Load(); !down || n == 0 {
			return fmt.Errorf("backend down %v, rebuilds %d after failing checks; want down and a rebuild", down, n)
		}
		return nil
	})
	hc.SetChecks(nil) // checks off: no longer held down by them
	if b.Down() {
		t.Error("backend still down after its checks were turned off")
	}
}

// TestRamping: a backend in slow start asks for its next step; one past it
// does not.
func TestRamping(t *testing.T) {
	b := backend.New("s", "a")
	now := time.Now()
	for range 3 {
		b.PassiveFail(3, time.Second, now)
	}
	b.ExpirePassive(now.Add(2 * time.Second))
	up := now.Add(2 * time.Second)
	if d := ramping(table(10*time.Second, b), up.Add(time.Second)); d != 500*time.Millisecond {
		t.Errorf("in slow start: next step in %v; want 500ms (a twentieth)", d)
	}
	if d := ramping(table(10*time.Second, b), up.Add(time.Minute)); d != 0 {
		t.Errorf("after slow start: next step in %v; want none", d)
	}
}

// TestWALOutlivesReload: the clock a service's checks share is the running
// checks' one, so what it learned of the primaries survives a reload (it
// was the service's backend.Group's before the checks moved here); a
// service whose checks are off gets a new one.
func TestWALOutlivesReload(t *testing.T) {
	pool := backend.Pool{}
	b := pool.Get("s", "a")
	hc := New(zerolog.Nop(), func() *sched.Table { return table(0, b) }, func() {})
	defer hc.Stop()
	if hc.WAL("s") == hc.WAL("s") {
		t.Fatal("a service without checks shares a clock before any SetChecks")
	}
	w := hc.WAL("s")
	w.Primary(time.Now(), 1, 100)
	job := Job{B: b, Spec: CheckSpec{Probe: Probe{Kind: CheckPgSQL, Addr: testkit.DeadAddr(t), Timeout: time.Second, WAL: w}, Interval: time.Hour, Rise: 1, Fall: 1}}
	hc.SetChecks([]Job{job})
	if got := hc.WAL("s"); got != w {
		t.Fatal("the next reload's build gets another clock than the running checks'")
	}
	if _, known := hc.WAL("s").Lag(time.Now(), 100, time.Minute); !known {
		t.Error("the running checks' clock forgot its primary")
	}
	hc.SetChecks(nil)
	if hc.WAL("s") == w {
		t.Error("a service whose checks are off keeps their clock")
	}
}
