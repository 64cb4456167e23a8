package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// birdNode is what docs/bird/bird.conf.tmpl needs.
type birdNode struct {
	RouterID, Local, Neighbor, Anycast, Log string
	LocalAS, NeighborAS                     int
}

// birdProduction is the rendering docs/scale-out.md shows.
var birdProduction = birdNode{RouterID: "192.0.2.11", Local: "192.0.2.11", LocalAS: 65010,
	Neighbor: "192.0.2.1", NeighborAS: 65000, Anycast: "198.51.100.10/32", Log: "syslog"}

// TestBirdConfig parses the production rendering of docs/bird/bird.conf.tmpl
// with BIRD's own parser (bird -p), where bird2 is installed (.ci/run
// installs it).
func TestBirdConfig(t *testing.T) {
	bird := needProgram(t, "bird")
	path := filepath.Join(t.TempDir(), "bird.conf")
	renderFile(t, "../../docs/bird/bird.conf.tmpl", path, birdProduction)
	if out, err := exec.Command(bird, "-p", "-c", path).CombinedOutput(); err != nil {
		t.Errorf("bird -p -c %s: %v\n%s", path, err, out)
	}
	// The parser must be able to say no, or the check above proves nothing.
	bad := birdProduction
	bad.Anycast = "198.51.100.10/33"
	renderFile(t, "../../docs/bird/bird.conf.tmpl", path, bad)
	if out, err := exec.Command(bird, "-p", "-c", path).CombinedOutput(); err == nil {
		t.Errorf("bird -p accepted a /33 route: %s", out)
	}
}

// TestBGPAnycast is the BGP recipe of docs/scale-out.md, run for real in
// network namespaces: two fulcrum instances with the same file hold one
// anycast address on lo; on each, BIRD (the repository's template) announces
// it to a router while docs/bird/fulcrum-anycast.sh sees /healthz pass. The
// router, BIRD too, installs both paths as one ECMP route hashed on the
// 5-tuple, and a client behind it connects in a bounded loop from eight
// addresses.
//
//  1. ECMP spreads the connections over both instances, and every client
//     address reaches the same backend through either (mh).
//  2. fulcrum drain on lb1: the route is withdrawn and every connection goes
//     to lb2; not one fails.
//  3. fulcrum drain -undo: lb1 is announced again and takes its share.
//  4. SIGTERM to lb1's fulcrum: its flows are refused until the route is
//     withdrawn; then the errors stop.
func TestBGPAnycast(t *testing.T) {
	t.Parallel() // mostly waiting on timers; its namespaces are its own
	l := newLab(t, "bgp")
	for _, tool := range []string{"bird", "birdc", "curl"} {
		needProgram(t, tool)
	}
	const (
		anycast = "10.78.100.10"
		admin   = "127.0.0.1:9900"
		lb1IP   = "10.78.0.11"
		lb2IP   = "10.78.0.12"
	)
	// A LAN (the bridge) for the router, the instances and the backends;
	// the client sits behind the router on a link of its own.
	rt := l.host(t, "rt", "10.78.0.1/24")
	lb1 := l.host(t, "lb1", lb1IP+"/24")
	lb2 := l.host(t, "lb2", lb2IP+"/24")
	be := l.host(t, "be", "10.78.0.21/24", "10.78.0.22/24")
	cl := l.ns(t, "cl")
	clients, cidrs := subnetHosts(10, 78, 1, 2, 8)
	l.link(t, "veth0", rt, "10.78.1.1/24", cl, cidrs...)
	l.ip(t, "-n", cl, "route", "add", "default", "via", "10.78.1.1")
	// The router forwards and hashes flows on ports too, so that one
	// client's connections spread (fib_multipath_hash_policy 1).
	l.ip(t, "netns", "exec", rt, "sh", "-c",
		"echo 1 >/proc/sys/net/ipv4/ip_forward && echo 1 >/proc/sys/net/ipv4/fib_multipath_hash_policy")
	for _, ns := range []string{lb1, lb2} {
		l.ip(t, "-n", ns, "addr", "add", anycast+"/32", "dev", "lo")
		l.ip(t, "-n", ns, "route", "add", "10.78.1.0/24", "via", "10.78.0.1")
	}
	config := labConfig(t, be, "10.78.0", admin, anycast+":80", "")
	f1, _ := fulcrumIn(t, lb1, config), fulcrumIn(t, lb2, config)

	dir := t.TempDir()
	router := filepath.Join(dir, "rt.conf")
	if err := os.WriteFile(router, fmt.Appendf(nil, `
log stderr all;
router id 10.78.0.1;
protocol device {
}
# Both instances' routes, merged into one ECMP route in the kernel.
protocol kernel {
	ipv4 { export all; };
	merge paths on;
}
protocol bgp lb1 {
	local 10.78.0.1 as 65000;
	neighbor %s as 65010;
	ipv4 { import all; export none; };
}
protocol bgp lb2 {
	local 10.78.0.1 as 65000;
	neighbor %s as 65010;
	ipv4 { import all; export none; };
}
`, lb1IP, lb2IP), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, rt, "bird", "-f", "-c", router, "-s", filepath.Join(dir, "rt.ctl"), "-P", filepath.Join(dir, "rt.pid"))
	script, err := filepath.Abs("../../docs/bird/fulcrum-anycast.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ name, ns, ip string }{{"lb1", lb1, lb1IP}, {"lb2", lb2, lb2IP}} {
		conf, ctl := filepath.Join(dir, n.name+".conf"), filepath.Join(dir, n.name+".ctl")
		renderFile(t, "../../docs/bird/bird.conf.tmpl", conf, birdNode{RouterID: n.ip, Local: n.ip, LocalAS: 65010, Neighbor: "10.78.0.1", NeighborAS: 65000,
			Anycast: anycast + "/32", Log: "stderr"})
		start(t, n.ns, "bird", "-f", "-c", conf, "-s", ctl, "-P", filepath.Join(dir, n.name+".pid"))
		start(t, n.ns, "env", "HEALTHZ=http://"+admin+"/healthz", "BIRDC=birdc -s "+ctl, "sh", script)
	}

	p := startProber(t, cl, clients, anycast+":80")
	p.diag = func() {
		out, _ := exec.Command("ip", "-n", rt, "route", "show", anycast).CombinedOutput()
		t.Logf("router's route to %s: %s", anycast, out)
	}
	const quiet = 2 * time.Second

	// 1. Both announced: the flows spread over both instances.
	begin := time.Now()
	var both time.Duration
	for since := begin; both == 0; {
		batch := p.collect(t, since, 40, 60*time.Second)
		via, failed := map[string]int{}, 0
		for _, a := range batch {
			if a.err != nil {
				failed++
			}
			via[a.via]++
		}
		if failed == 0 && via[lb1IP] > 0 && via[lb2IP] > 0 {
			both = batch[0].start.Sub(begin)
		}
		since = batch[len(batch)-1].start
		if time.Since(begin) > 60*time.Second {
			t.Fatalf("the anycast address was not served by both instances within 60s; last batch: %v", via)
		}
	}
	t.Logf("both instances announced and reached %v after BIRD started", both.Round(time.Millisecond))
	spread := map[string]int{}
	for _, a := range p.collect(t, time.Now(), 200, 30*time.Second) {
		if a.err != nil {
			t.Errorf("with both announced: %v", a.err)
		}
		spread[a.via]++
	}
	if spread[lb1IP] < 40 || spread[lb2IP] < 40 {
		t.Errorf("ECMP spread 200 connections %v; want at least 40 through each instance", spread)
	}

	// 2. Drain lb1: withdrawn, and nothing fails.
	t0 := time.Now()
	drainIn(t, lb1, admin)
	f1.await(t, logDraining)
	first, errs := p.settle(t, t0, lb2IP, quiet, 30*time.Second)
	withdrawn := first.start.Sub(t0)
	if len(errs) > 0 {
		t.Errorf("%d connections failed while lb1 drained; the last: %v", len(errs), lastErr(errs))
	}

	// 3. Undrain lb1: announced again, it takes flows again.
	t1 := time.Now()
	drainIn(t, lb1, admin, "-undo")
	var back time.Duration
	for back == 0 {
		a := p.next(t, t1, time.After(30*time.Second), "a connection through lb1 after undrain")
		if a.err != nil {
			t.Errorf("while lb1 was announced again: %v", a.err)
		}
		if a.via == lb1IP {
			back = a.end.Sub(t1)
		}
	}

	// 4. Stop lb1's fulcrum: refused until withdrawn, then nothing fails.
	t2 := time.Now()
	f1.cmd.Process.Signal(syscall.SIGTERM)
	first, errs = p.settle(t, t2, lb2IP, quiet, 30*time.Second)
	stopped := first.start.Sub(t2)
	select {
	case <-f1.exit:
	case <-time.After(10 * time.Second):
		t.Error("lb1's fulcrum did not exit after SIGTERM")
	}

	t.Logf("ECMP: 200 connections spread %v, each client address on one backend through both: %v", spread, p.seen)
	t.Logf("drain: lb1 withdrawn, every new connection through lb2 from %v after the drain; 0 failed", withdrawn.Round(time.Millisecond))
	t.Logf("undrain: lb1 served again %v after", back.Round(time.Millisecond))
	t.Logf("stop: every new connection through lb2 from %v after SIGTERM; %d failed before that (%v)",
		stopped.Round(time.Millisecond), len(errs), lastErr(errs))
	for _, d := range []time.Duration{withdrawn, back, stopped} {
		if d > 15*time.Second {
			t.Errorf("a route change took %v; want well under 15s (checks every 1s, fall and rise 2)", d)
		}
	}
	if len(distinct(p.seen)) < 2 {
		t.Errorf("clients and backends: %v; want both backends used", p.seen)
	}
}
