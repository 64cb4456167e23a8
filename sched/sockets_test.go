package sched_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
)

// The scheduler family over sockets: a whole proxy (testkit/proxy) serving
// a configuration, real loopback backends that greet with their name, and
// clients that read the greeting. The orders themselves are held to their
// references in this package's own tests; these prove that a connection
// follows them.

// greeters starts one loopback Greeter per name and returns their
// addresses by name.
func greeters(t *testing.T, names ...string) map[string]string {
	t.Helper()
	addrs := map[string]string{}
	for _, name := range names {
		addrs[name] = testkit.NewServer(t, testkit.Greeter(name)).Addr
	}
	return addrs
}

// svcSpec is one service of a rendered configuration; backends are names,
// each "name/weight", their addresses taken from addrs. The first service
// listens on 127.0.0.1:0, the next on 127.0.0.2:0, and so on.
type svcSpec struct {
	name, scheduler string
	extra           string // further service keys, one per line
	backends        []string
}

func render(addrs map[string]string, svcs ...svcSpec) string {
	var b strings.Builder
	for k, s := range svcs {
		fmt.Fprintf(&b, "[services.%s]\nlisten = [\"127.0.0.%d:0\"]\nscheduler = %q\ndrain_timeout = \"2s\"\n%s\n",
			s.name, k+1, s.scheduler, s.extra)
		for _, be := range s.backends {
			name, weight, _ := strings.Cut(be, "/")
			fmt.Fprintf(&b, "[[services.%s.backends]]\nname = %q\naddress = %q\nweight = %s\n", s.name, name, addrs[name], weight)
		}
	}
	return b.String()
}

// connect opens a connection through addr from local address from (nil:
// any) and returns the backend's greeting; the connection stays open until
// close is called or the test ends.
func connect(t *testing.T, addr string, from net.IP) (name string, close func()) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial proxy from %v: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read greeting from %v: %v", from, err)
	}
	return strings.TrimSpace(line), func() { c.Close() }
}

// sequence makes n connections one after another, each closed before the
// next opens, and returns the backends that answered.
func sequence(t *testing.T, addr string, n int) []string {
	out := make([]string, n)
	for k := range out {
		var close func()
		out[k], close = connect(t, addr, nil)
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
			p := proxy.Start(t, render(addrs, svcSpec{name: "s", scheduler: c.scheduler, backends: []string{"a/5", "b/3", "c/2"}}))
			if got := strings.Join(sequence(t, p.Addr(t, "127.0.0.1:0"), 20), " "); got != c.want+" "+c.want {
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
			p := proxy.Start(t, render(addrs, svcSpec{name: "s", scheduler: sched, backends: []string{"a/1"}}))
			addr := p.Addr(t, "127.0.0.1:0")
			for range 6 {
				if got, _ := connect(t, addr, nil); got != "a" {
					t.Fatalf("with only a configured, a connection went to %s", got)
				}
			}
			p.Reload(t, render(addrs, svcSpec{name: "s", scheduler: sched, backends: []string{"a/1", "b/1"}}))
			for k := range 5 { // held open: b's count climbs to 5, still below a's 6
				if got, _ := connect(t, addr, nil); got != "b" {
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
			p := proxy.Start(t, render(addrs, c.before...))
			addr := p.Addr(t, "127.0.0.1:0")
			first := map[string]string{}
			seen := map[string]bool{}
			for _, ip := range clients() {
				got, close := connect(t, addr, ip)
				close()
				again, close := connect(t, addr, ip)
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
			gen := p.Snapshot().Gen
			p.Reload(t, render(addrs, c.after...))
			if g := p.Snapshot().Gen; g != gen+1 {
				t.Fatalf("generation %d after the reload; want %d", g, gen+1)
			}
			moved := 0
			for _, ip := range clients() {
				got, close := connect(t, addr, ip)
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

// TestFallback: a service whose own backends are all down picks from its
// fallback's, and returns to its own as soon as one is up.
func TestFallback(t *testing.T) {
	testkit.CheckLeaks(t)
	w := testkit.NewServer(t, testkit.Greeter("writer"))
	replica := testkit.DeadAddr(t)
	health := func(s string) string {
		return "[services." + s + ".health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	}
	p := proxy.Start(t, fmt.Sprintf(`[services.ro]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
fallback = "rw"
backends = [{ name = "r", address = %q }]
[services.rw]
listen = ["127.0.0.2:0"]
drain_timeout = "3s"
backends = [{ name = "w", address = %q }]
`, replica, w.Addr)+health("ro")+health("rw"))
	ro := p.Addr(t, "127.0.0.1:0")
	backendLine := func(msg, name string) func(map[string]any) bool {
		return func(m map[string]any) bool { return m["message"] == msg && m["backend"] == name }
	}
	p.Logs.Wait(t, 5*time.Second, "r down", backendLine("backend down", "r"))
	if name, err := testkit.Greeting(ro); name != "writer" {
		t.Errorf("ro with its replica down: %q, %v; want the writer", name, err)
	}
	testkit.NewServerAt(t, replica, testkit.Greeter("replica"))
	p.Logs.Wait(t, 5*time.Second, "r up", backendLine("backend up", "r"))
	if name, err := testkit.Greeting(ro); name != "replica" {
		t.Errorf("ro with its replica back: %q, %v; want the replica", name, err)
	}
}
