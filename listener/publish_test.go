package listener

import (
	"bufio"
	"errors"
	"net/netip"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// TestPublishWakesHeld (issue 27, defect 2): a connection held for want of
// an eligible backend (hold_timeout) is served as soon as a snapshot with
// one is published, whoever publishes it. Before Publish, reload's swap
// kicked every hold queue itself, and a snapshot stored any other way left
// the client waiting until hold_timeout.
func TestPublishWakesHeld(t *testing.T) {
	testkit.CheckLeaks(t)
	p := newProxy(t, "rr", []testBackend{{"dead", testkit.DeadAddr(t), 1}}, func(s tuned) {
		s.HoldTimeout, s.Retries = 30*time.Second, 0
	})
	c := dialTCP(t, p.addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	testkit.WaitFor(t, 10*time.Second, func() error { // holding has no event to wait on
		if p.adm().stats().Holding == 0 {
			return errors.New("the connection was not held")
		}
		return nil
	})

	// The next table: a live backend, published by a caller that does
	// nothing else (no reload, no check).
	live := testkit.NewServer(t, testkit.Greeter("live"))
	next := *p.svc
	next.Targets = []sched.Target{{B: p.svc.Targets[0].B, Addr: netip.MustParseAddrPort(live.Addr), Weight: 1, Base: 1}}
	picker, err := sched.New("rr", next.Targets, nil, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	next.Picker = picker
	key := netip.MustParseAddrPort("127.0.0.1:0")
	published := time.Now()
	p.srv.Publish(NewSnapshot(sched.NewTable(2, []*sched.Service{&next}, map[netip.AddrPort]*sched.Service{key: &next}),
		map[string]*Policy{next.Name: p.pol}))
	g, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || g != "live\n" {
		t.Fatalf("the held connection read %q, %v after %v; want the live backend's greeting (hold_timeout is 30s)",
			g, err, time.Since(published).Round(time.Millisecond))
	}
	if d := time.Since(published); d > 10*time.Second {
		t.Errorf("served %v after the publish; want at once, not at hold_timeout", d)
	}
}
