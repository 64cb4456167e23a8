package reload

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/conf"
)

// End-to-end tests of the scheduler family: a config applied through
// Manager.Apply, a real listener, real loopback backends that greet with
// their name, and clients that read the greeting.

// greeters starts one loopback backend per name; each writes its name and a
// newline, then holds the connection until the client closes it. The
// test's cleanup closes them and waits for their goroutines.
func greeters(t *testing.T, names ...string) map[string]string {
	t.Helper()
	addrs := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex // protects conns
	var conns []net.Conn
	var lns []net.Listener
	for _, name := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs[name] = ln.Addr().String()
		wg.Add(1)
		go func() { // exits when the cleanup closes ln
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				wg.Add(1)
				go func() { // exits when the client (or the cleanup) closes c
					defer wg.Done()
					defer c.Close()
					fmt.Fprintf(c, "%s\n", name)
					var b [64]byte
					for {
						if _, err := c.Read(b[:]); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return addrs
}

// svcSpec is one service of a rendered config; backends are names, each
// "name/weight", their addresses taken from addrs.
type svcSpec struct {
	name, scheduler string
	extra           string // further service keys, one per line
	backends        []string
}

func renderSpec(t *testing.T, addrs map[string]string, svcs ...svcSpec) *conf.Config {
	t.Helper()
	var b strings.Builder
	for k, s := range svcs {
		fmt.Fprintf(&b, "[services.%s]\nlisten = [\"127.0.0.1:%d\"]\nscheduler = %q\ndrain_timeout = \"2s\"\n%s\n",
			s.name, k, s.scheduler, s.extra)
		for _, be := range s.backends {
			name, weight, _ := strings.Cut(be, "/")
			fmt.Fprintf(&b, "[[services.%s.backends]]\nname = %q\naddress = %q\nweight = %s\n", s.name, name, addrs[name], weight)
		}
	}
	cfg, err := conf.Parse("e2e.toml", []byte(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	return cfg
}

// e2e is a harness with one service listening on 127.0.0.1:0.
type e2e struct {
	*harness
	addrs map[string]string
	proxy string // the service's bound address
}

func newE2E(t *testing.T, addrs map[string]string, svcs ...svcSpec) *e2e {
	t.Helper()
	e := &e2e{harness: newHarness(t), addrs: addrs}
	if err := e.m.Apply(renderSpec(t, addrs, svcs...)); err != nil {
		t.Fatal(err)
	}
	e.proxy = e.srv.Addr(netip.MustParseAddrPort("127.0.0.1:0")).String()
	return e
}

// connect opens a connection through the proxy from local address from
// (nil: any) and returns the backend's greeting; the connection stays open
// until close is called or the test ends.
func (e *e2e) connect(from net.IP) (name string, close func()) {
	e.t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", e.proxy)
	if err != nil {
		e.t.Fatalf("dial proxy from %v: %v", from, err)
	}
	e.t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		e.t.Fatalf("read greeting from %v: %v", from, err)
	}
	return strings.TrimSpace(line), func() { c.Close() }
}

// sequence makes n connections one after another, each closed before the
// next opens, and returns the backends that answered.
func (e *e2e) sequence(n int) []string {
	out := make([]string, n)
	for k := range out {
		var close func()
		out[k], close = e.connect(nil)
		close()
	}
	return out
}

// TestE2ERoundRobinOrder: sequential connections follow the wrr and swrr
// orders for weights 5/3/2.
func TestE2ERoundRobinOrder(t *testing.T) {
	addrs := greeters(t, "a", "b", "c")
	for _, c := range []struct{ scheduler, want string }{
		{"wrr", "a a a b a b c a b c"},  // LVS: cw 5,4: a; 3: a b; 2,1: a b c
		{"swrr", "a b c a a b a c b a"}, // nginx, traced by hand in the README
	} {
		t.Run(c.scheduler, func(t *testing.T) {
			e := newE2E(t, addrs, svcSpec{name: "s", scheduler: c.scheduler, backends: []string{"a/5", "b/3", "c/2"}})
			if got := strings.Join(e.sequence(20), " "); got != c.want+" "+c.want {
				t.Errorf("backends = %s; want %s twice", got, c.want)
			}
		})
	}
}

// TestE2ELeastConnSteers: with a holding many open connections, lc and its
// weighted kin send new connections to b until b holds as many. (p2c may
// draw a twice, so it is held to this only statistically, in sched.)
func TestE2ELeastConnSteers(t *testing.T) {
	addrs := greeters(t, "a", "b")
	for _, sched := range []string{"lc", "wlc", "sed", "nq"} {
		t.Run(sched, func(t *testing.T) {
			e := newE2E(t, addrs, svcSpec{name: "s", scheduler: sched, backends: []string{"a/1"}})
			for range 6 {
				if got, _ := e.connect(nil); got != "a" {
					t.Fatalf("with only a configured, a connection went to %s", got)
				}
			}
			if err := e.m.Apply(renderSpec(t, addrs, svcSpec{name: "s", scheduler: sched, backends: []string{"a/1", "b/1"}})); err != nil {
				t.Fatal(err)
			}
			for k := range 5 { // held open: b's count climbs to 5, still below a's 6
				if got, _ := e.connect(nil); got != "b" {
					t.Fatalf("new connection %d went to %s; want b (a holds 6 open, b %d)", k, got, k)
				}
			}
		})
	}
}

// clients are loopback source addresses for the hashing tests.
func clients() []net.IP {
	var ips []net.IP
	for n := 2; n < 42; n++ {
		ips = append(ips, net.IPv4(127, 0, byte(n%3), byte(n)))
	}
	return ips
}

// TestE2EHashingSticks: sh and mh send each client address to the same
// backend on every connection, and across reloads. mh's reload adds a
// backend to the same service: clients either keep their backend or move
// to the new one (Maglev's minimal disruption). sh is not consistent
// hashing (LVS reassigns every bucket when its service changes), so its
// reload adds a backend to another service: its own table is untouched.
func TestE2EHashingSticks(t *testing.T) {
	addrs := greeters(t, "a", "b", "c", "d", "x")
	for _, c := range []struct {
		scheduler string
		before    []svcSpec
		after     []svcSpec
	}{
		{"mh",
			[]svcSpec{{name: "s", scheduler: "mh", backends: []string{"a/1", "b/1", "c/1"}}},
			[]svcSpec{{name: "s", scheduler: "mh", backends: []string{"a/1", "b/1", "c/1", "d/1"}}}},
		{"sh",
			[]svcSpec{{name: "s", scheduler: "sh", backends: []string{"a/1", "b/2", "c/1"}}},
			[]svcSpec{{name: "s", scheduler: "sh", backends: []string{"a/1", "b/2", "c/1"}},
				{name: "other", scheduler: "rr", backends: []string{"x/1"}}}},
	} {
		t.Run(c.scheduler, func(t *testing.T) {
			e := newE2E(t, addrs, c.before...)
			first := map[string]string{}
			seen := map[string]bool{}
			for _, ip := range clients() {
				got, close := e.connect(ip)
				close()
				again, close := e.connect(ip)
				close()
				if got != again {
					t.Fatalf("client %v went to %s, then to %s", ip, got, again)
				}
				first[ip.String()] = got
				seen[got] = true
			}
			if len(seen) < 3 {
				t.Errorf("40 clients reached only %v", seen)
			}
			gen := e.srv.Snapshot().Gen
			if err := e.m.Apply(renderSpec(t, addrs, c.after...)); err != nil {
				t.Fatal(err)
			}
			if e.srv.Snapshot().Gen != gen+1 {
				t.Fatal("the reload did not apply")
			}
			moved := 0
			for _, ip := range clients() {
				got, close := e.connect(ip)
				close()
				switch want := first[ip.String()]; {
				case got == want:
				case c.scheduler == "mh" && got == "d":
					moved++
				default:
					t.Errorf("after the reload client %v went to %s; want %s", ip, got, want)
				}
			}
			t.Logf("%s: %d of 40 clients moved to the new backend", c.scheduler, moved)
			if c.scheduler == "mh" && moved == 0 {
				t.Error("no client moved to the new backend: did the table change at all?")
			}
		})
	}
}

// TestE2EOptionsRebuild: changing a scheduler option rebuilds the picker;
// an unchanged service keeps it.
func TestE2EOptionsRebuild(t *testing.T) {
	addrs := greeters(t, "a", "b")
	spec := svcSpec{name: "s", scheduler: "p2c", backends: []string{"a/1", "b/1"}}
	e := newE2E(t, addrs, spec)
	p1 := e.srv.Snapshot().Services[0].Picker
	if err := e.m.Apply(renderSpec(t, addrs, spec)); err != nil {
		t.Fatal(err)
	}
	if e.srv.Snapshot().Services[0].Picker != p1 {
		t.Error("an unchanged service got a new picker")
	}
	spec.extra = "choices = 3"
	if err := e.m.Apply(renderSpec(t, addrs, spec)); err != nil {
		t.Fatal(err)
	}
	if s := e.srv.Snapshot().Services[0]; s.Picker == p1 || s.Options.Choices != 3 {
		t.Errorf("after choices = 3: same picker %v, options %+v", s.Picker == p1, s.Options)
	}
	if got := e.sequence(4); slices.Contains(got, "") {
		t.Errorf("connections after the rebuild = %v", got)
	}
}
