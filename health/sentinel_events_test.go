package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

type sentinelEvent struct{ event, payload string }

// watch runs WatchSentinel on addr until the test ends, and returns its
// events and losses.
func watch(t *testing.T, p *Probe, addr string) (<-chan sentinelEvent, <-chan error) {
	events, losses := make(chan sentinelEvent, 256), make(chan error, 256)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { // ends at cancel
		p.WatchSentinel(ctx, addr, func(e, pl string) { events <- sentinelEvent{e, pl} }, func(err error) { losses <- err })
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return events, losses
}

func awaitEvent(t *testing.T, events <-chan sentinelEvent, want string) sentinelEvent {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if e.event == want {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s event within 30s", want)
		}
	}
}

// TestWatchSentinelFailover: subscribed to a real Sentinel, SENTINEL
// FAILOVER wakes the watcher with +try-failover before the promotion
// (+failover-state-send-slaveof-noone), and a check of the old master at
// that event already finds it in the wrong role: the window in which it
// would acknowledge writes that its resync erases is closed before it
// opens.
func TestWatchSentinelFailover(t *testing.T) {
	ss := testkit.StartSentinel(t, 1)
	old := ss.Master()
	p := &Probe{Kind: CheckRedis, Addr: old, Backend: old, Timeout: 3 * time.Second, Role: backend.RolePrimary,
		Sentinels: ss.Sentinels, MasterName: ss.Name}
	events, _ := watch(t, p, ss.Sentinels[0])
	awaitEvent(t, events, "subscribed")
	wantRole(t, "master before the failover", p, backend.RolePrimary, "")

	ss.Failover(t)
	e := awaitEvent(t, events, "+try-failover")
	if want := "master " + ss.Name + " "; !strings.HasPrefix(e.payload, want) {
		t.Errorf("+try-failover payload %q; want it to start %q", e.payload, want)
	}
	got, err := p.Check(t.Context())
	var wr *WrongRoleError
	if !errors.As(err, &wr) || got != backend.RolePrimary {
		t.Errorf("the old master checked at +try-failover: %q, %v; want primary in the wrong role", got, err)
	}
	awaitEvent(t, events, "+failover-state-send-slaveof-noone") // the promotion comes after
	awaitEvent(t, events, "+switch-master")
}

// TestWatchSentinelReconnects: a Sentinel that drops the subscription is
// subscribed to again (reported lost, then subscribed), events about other
// masters are ignored, and -failover-abort-* (a pattern) wakes it.
func TestWatchSentinelReconnects(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	addr := testkit.NewServer(t, func(c *net.TCPConn) {
		r := bufio.NewReader(c)
		for range 2 { // SUBSCRIBE …, PSUBSCRIBE …
			v, err := testkit.ReadRESP(r)
			args, _ := v.([]any)
			if err != nil || len(args) < 2 {
				return
			}
			for i, ch := range args[1:] {
				fmt.Fprintf(c, "*3\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n:%d\r\n", len(strings.ToLower(args[0].(string))), strings.ToLower(args[0].(string)), len(ch.(string)), ch, i+1)
			}
		}
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		if n == 1 {
			return // dropped: the watcher dials again
		}
		c.Write(testkit.RESP("message", "+try-failover", "master other 127.0.0.1 7000"))
		c.Write(testkit.RESP("pmessage", "-failover-abort-*", "-failover-abort-not-elected", "master mymaster 127.0.0.1 6379"))
		r.ReadByte() // until the watcher closes
	}).Addr
	p := &Probe{Kind: CheckRedis, Timeout: time.Second, MasterName: "mymaster"}
	events, losses := watch(t, p, addr)
	awaitEvent(t, events, "subscribed")
	select {
	case <-losses:
	case <-time.After(30 * time.Second):
		t.Fatal("the dropped subscription was not reported")
	}
	awaitEvent(t, events, "subscribed")
	if e := <-events; e.event != "-failover-abort-not-elected" || e.payload != "master mymaster 127.0.0.1 6379" {
		t.Errorf("event %+v; want -failover-abort-not-elected for mymaster (the other master's ignored)", e)
	}
}

func TestSentinelAbout(t *testing.T) {
	for _, tc := range []struct {
		event, payload string
		want           bool
	}{
		{"+try-failover", "master mymaster 127.0.0.1 6379", true},
		{"+try-failover", "master mymaster2 127.0.0.1 6379", false},
		{"+selected-slave", "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379", true},
		{"+selected-slave", "slave 127.0.0.1:6380 127.0.0.1 6380 @ other 127.0.0.1 6379", false},
		{"+switch-master", "mymaster 127.0.0.1 6379 127.0.0.1 6380", true},
		{"+switch-master", "other 127.0.0.1 6379 127.0.0.1 6380", false},
		{"+config-update-from", "sentinel 9e46 127.0.0.1 26379 @ mymaster 127.0.0.1 6379", true},
		{"+try-failover", "", false},
	} {
		if got := sentinelAbout("mymaster", tc.event, tc.payload); got != tc.want {
			t.Errorf("sentinelAbout(%q, %q) = %v; want %v", tc.event, tc.payload, got, tc.want)
		}
	}
}
