package reload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// dnsStub is a resolver the test controls: names it knows answer at once,
// names it does not fail, and with hang set every lookup waits until its
// context ends, like a DNS server that never answers.
type dnsStub struct {
	mu    sync.Mutex // protects addrs, hang and calls
	addrs map[string]netip.Addr
	hang  bool
	calls int
}

func (d *dnsStub) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	a, ok := d.addrs[host]
	hang := d.hang
	d.calls++
	d.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if !ok {
		return nil, errors.New("no such host")
	}
	return []netip.Addr{a}, nil
}

func (d *dnsStub) set(host string, a netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.addrs == nil {
		d.addrs = map[string]netip.Addr{}
	}
	d.addrs[host] = a
}

// TestUnresolvableBackend: a name that does not resolve takes only its
// backend down, with the reason, while the rest of the file applies; once
// the name resolves (here on SIGHUP) the backend takes connections.
func TestUnresolvableBackend(t *testing.T) {
	a := testkit.NewServer(t, greetEcho("a"))
	b := testkit.NewServer(t, greetEcho("b"))
	dns := &dnsStub{}
	bPort := b.Addr[strings.LastIndex(b.Addr, ":"):]
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr", backends: []be{
		{name: "a", addr: a.Addr, weight: 1}, {name: "b", addr: "b.test" + bPort, weight: 1}}})
	r := startRun(t, t.TempDir(), text, func(o *Options) { o.Lookup = dns.lookup })
	bk := r.srv.Snapshot().Services[0].Targets[1].B
	if up, reason, _ := bk.Health(); up || !strings.HasPrefix(reason, "resolve: ") {
		t.Fatalf("backend b: up %v, reason %q; want down with a resolve reason", up, reason)
	}
	addr := r.addr("127.0.0.1:0")
	for i := range 4 {
		if got, err := testkit.Greeting(addr); err != nil || got != "a" {
			t.Fatalf("connection %d reached %q (%v); want a, the only backend with an address", i, got, err)
		}
	}
	dns.set("b.test", netip.MustParseAddr("127.0.0.1"))
	r.hup <- struct{}{}
	r.expectGen(2, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for seen := map[string]bool{}; !seen["b"]; {
		got, err := testkit.Greeting(addr)
		if err != nil {
			t.Fatal(err)
		}
		seen[got] = true
		if time.Now().After(deadline) {
			t.Fatalf("backend b never served after its name resolved (health %v)", bk.Down())
		}
	}
}

// TestLoopNeverBlocks: while a reload waits on a DNS server that never
// answers, Run's loop still pings the watchdog, rebuilds the table on a
// health change and returns promptly when its context ends.
func TestLoopNeverBlocks(t *testing.T) {
	a := testkit.NewServer(t, greetEcho("a"))
	dns := &dnsStub{}
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{name: "a", addr: a.Addr, weight: 1}}})
	r := startRun(t, t.TempDir(), text, func(o *Options) {
		o.Lookup = dns.lookup
		o.ResolveTimeout = time.Hour
		o.Watchdog = 200 * time.Millisecond
	})
	dns.mu.Lock()
	dns.hang = true
	dns.mu.Unlock()
	renameOver(t, r.path, render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{
		{name: "a", addr: a.Addr, weight: 1}, {name: "slow", addr: "slow.test:1", weight: 1}}}))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		dns.mu.Lock()
		calls := dns.calls
		dns.mu.Unlock()
		if calls > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the edit never reached the resolver")
		}
	}
	// Three watchdog pings while the lookup hangs.
	timeout := time.After(10 * time.Second)
	for pings := 0; pings < 3; {
		select {
		case s := <-r.events:
			if strings.HasPrefix(s, "WATCHDOG=1") {
				pings++
			}
		case <-timeout:
			t.Fatalf("%d watchdog pings in 10 s while a reload waited on DNS; want 3", pings)
		}
	}
	// A health change is served: the table is rebuilt (new Seq, same Gen).
	before := r.srv.Snapshot()
	bk := before.Services[0].Targets[0].B
	for range 3 {
		bk.PassiveFail(3, time.Hour, time.Now())
	}
	for deadline := time.Now().Add(10 * time.Second); r.srv.Snapshot().Seq == before.Seq; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the table was not rebuilt after a health change while a reload waited on DNS")
		}
	}
	if g := r.srv.Snapshot().Gen; g != before.Gen {
		t.Errorf("generation %d; want %d: the hanging reload must not have applied", g, before.Gen)
	}
	// SIGTERM: Run returns at once, the hanging lookup abandoned.
	start := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context ending while a lookup hung")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %v to stop", d)
	}
}

// TestAddressChange: when a backend's host name starts resolving to
// another address, the change is applied like a reload (a new generation,
// logged with trigger dns): new connections reach the new address while a
// session opened on the old one runs on.
func TestAddressChange(t *testing.T) {
	// Two backends on one port, on two loopback addresses.
	var a *testkit.Server
	for range 100 {
		port := 20000 + rand.IntN(12000)
		la, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		lb, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port))
		if err != nil {
			la.Close()
			continue
		}
		a = testkit.Serve(t, la.(*net.TCPListener), greetEcho("a"))
		testkit.Serve(t, lb.(*net.TCPListener), greetEcho("b"))
		break
	}
	if a == nil {
		t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	}
	port := a.Addr[strings.LastIndex(a.Addr, ":"):]
	dns := &dnsStub{}
	dns.set("db.test", netip.MustParseAddr("127.0.0.1"))
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr",
		backends: []be{{name: "db", addr: "db.test" + port, weight: 1}}})
	text = strings.Replace(text, "[reload]\n", "[reload]\nresolve_interval = \"1s\"\n", 1)
	r := startRun(t, t.TempDir(), text, func(o *Options) { o.Lookup = dns.lookup })
	addr := r.addr("127.0.0.1:0")
	old, err := dialSession(addr) // a session on the old address, kept open
	if err != nil {
		t.Fatal(err)
	}
	defer old.c.Close()
	if old.backend != "a" {
		t.Fatalf("first session reached %q; want a", old.backend)
	}

	dns.set("db.test", netip.MustParseAddr("127.0.0.2"))
	r.expectGen(2, 10*time.Second) // at the next resolve_interval
	if line := r.logs.Wait(t, 5*time.Second, "the reload", testkit.Message("reload applied")); line["trigger"] != "dns" {
		t.Errorf("trigger = %v; want dns", line["trigger"])
	}
	if got, err := testkit.Greeting(addr); err != nil || got != "b" {
		t.Fatalf("a new connection reached %q (%v); want b, the new address", got, err)
	}
	if err := old.roundTrip(rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Errorf("the session on the old address: %v", err)
	}
}

// TestWatchdogWithheld: while the accept loops do not answer (Alive is
// false: a frozen loop, see listener's TestFrozenAcceptLoopNotAlive) the
// loop sends no WATCHDOG=1, so systemd restarts the unit; pings resume
// when they answer again.
func TestWatchdogWithheld(t *testing.T) {
	a := testkit.NewServer(t, greetEcho("a"))
	var frozen atomic.Bool
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{name: "a", addr: a.Addr, weight: 1}}}),
		func(o *Options) {
			o.Watchdog = 100 * time.Millisecond
			o.Alive = func(time.Duration) bool { return !frozen.Load() }
		})
	pings := func(n int, within time.Duration) int {
		t.Helper()
		got := 0
		timeout := time.After(within)
		for got < n {
			select {
			case s := <-r.events:
				if strings.HasPrefix(s, "WATCHDOG=1") {
					got++
				}
			case <-timeout:
				return got
			}
		}
		return got
	}
	if n := pings(3, 10*time.Second); n < 3 {
		t.Fatalf("%d pings in 10 s while alive; want 3", n)
	}
	frozen.Store(true)
	r.logs.Wait(t, 10*time.Second, "the withheld ping", testkit.Message("an accept loop did not answer; withholding the watchdog ping"))
	for len(r.events) > 0 { // pings sent before the freeze was seen
		<-r.events
	}
	if n := pings(1, time.Second); n != 0 { // ten intervals
		t.Errorf("%d pings while an accept loop was frozen; want none", n)
	}
	frozen.Store(false)
	if n := pings(3, 10*time.Second); n < 3 {
		t.Errorf("%d pings in 10 s after the loop answered again; want 3", n)
	}
}
