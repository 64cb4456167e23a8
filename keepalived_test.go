package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"fulcrum/listener/listenertest"
)

// keepalivedNode is what docs/keepalived/keepalived.conf.tmpl needs.
type keepalivedNode struct {
	Name, Interface, State, VIP, Healthz string
	Priority, VirtualRouterID            int
}

// renderKeepalived renders the repository's template for node into dir.
func renderKeepalived(t *testing.T, dir string, node keepalivedNode) string {
	t.Helper()
	tmpl, err := template.ParseFiles("docs/keepalived/keepalived.conf.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, node.Name+".conf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tmpl.Execute(f, node); err != nil {
		t.Fatalf("render %s: %v", path, err)
	}
	return path
}

// attempt is one client connection through the virtual address.
type attempt struct {
	start, end time.Time
	from       netip.Addr
	via        string // the fulcrum instance that served it, as the backend saw it
	backend    string
	err        error
}

// TestKeepalivedFailover is the keepalived recipe of docs/scale-out.md, run
// for real: two fulcrum instances with the same file, each in its own
// network namespace with keepalived tracking its /healthz through the
// repository's template, one virtual address, two backends in a third
// namespace, and a client in a fourth that connects through the virtual
// address in a bounded loop, from eight addresses of its own.
//
//  1. fulcrum drain on the active instance: /healthz fails, keepalived gives
//     up the address and the backup takes it; not one new connection fails.
//  2. fulcrum drain -undo: the preferred instance takes the address back.
//  3. SIGTERM to the active fulcrum (a stop): connections are refused until
//     the address moves; then the errors stop.
//
// Each client address reaches the same backend through either instance
// (mh). The failover times are logged.
func TestKeepalivedFailover(t *testing.T) {
	l := newLab(t)
	for _, tool := range []string{"keepalived", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (.ci/run installs it)", tool)
		}
	}
	const (
		vip   = "10.77.0.100"
		admin = "127.0.0.1:9900" // each namespace has its own loopback
	)
	be := l.host(t, "be", "10.77.0.21/24", "10.77.0.22/24")
	lb1 := l.host(t, "lb1", "10.77.0.11/24")
	lb2 := l.host(t, "lb2", "10.77.0.12/24")
	var clients []netip.Addr
	var cidrs []string
	for i := 2; i < 10; i++ {
		a := netip.AddrFrom4([4]byte{10, 77, 0, byte(i)})
		clients, cidrs = append(clients, a), append(cidrs, a.String()+"/24")
	}
	cl := l.host(t, "cl", cidrs...)

	// Backends greet with their name and the address the connection came
	// from: the fulcrum instance that proxied it.
	for i, a := range []string{"10.77.0.21:7000", "10.77.0.22:7000"} {
		name := fmt.Sprintf("be%d", i+1)
		var ln *net.TCPListener
		if err := inNetns(be, func() (err error) {
			c, err := net.Listen("tcp", a)
			if err == nil {
				ln = c.(*net.TCPListener)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		listenertest.Serve(t, ln, func(c *net.TCPConn) {
			from := c.RemoteAddr().(*net.TCPAddr).IP
			fmt.Fprintf(c, "%s %s\n", name, from)
		})
	}

	// The same fulcrum file for both: the virtual address is bound before
	// it is here ([cluster] freebind), so the backup starts like the active.
	config := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
access = false
[admin]
listen = %q
[cluster]
freebind = true
[services.app]
listen = ["%s:80"]
scheduler = "mh"
backends = [{ name = "be1", address = "10.77.0.21:7000" }, { name = "be2", address = "10.77.0.22:7000" }]
`, admin, vip))
	fulcrum := func(ns string) *daemon {
		d := startDaemonArgs(t, []string{"-c", `exec ip netns exec "$1" "$0" -config "$2"`, os.Args[0], ns, config}, nil, nil)
		d.await(t, "listening")
		return d
	}
	f1, _ := fulcrum(lb1), fulcrum(lb2)

	dir := t.TempDir()
	os.Chmod(dir, 0o755) // enable_script_security checks the path of what it runs
	for i, node := range []keepalivedNode{
		{Name: "lb1", State: "MASTER", Priority: 150},
		{Name: "lb2", State: "BACKUP", Priority: 100},
	} {
		node.Interface, node.VIP, node.VirtualRouterID, node.Healthz = "eth0", vip+"/24", 51, "http://"+admin+"/healthz"
		conf := renderKeepalived(t, dir, node)
		ns := []string{lb1, lb2}[i]
		start(t, ns, "keepalived", "--dont-fork", "--log-console", "--log-detail", "--no-syslog", "--vrrp",
			"-f", conf, "-p", filepath.Join(dir, node.Name+".pid"), "-r", filepath.Join(dir, node.Name+"-vrrp.pid"))
	}

	// The client: a new connection every 50ms from the next client address,
	// each with a 5s connect timeout, at most 1,600 (80s) in all.
	results := make(chan attempt, 2000)
	ctx, stopClient := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // exits when stopClient is called or after 1,600 attempts
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := range 1600 {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() { // exits within the 5s connect and read timeouts
				defer wg.Done()
				results <- connectVia(cl, clients[i%len(clients)], vip+":80")
			}()
		}
	}()
	t.Cleanup(func() { stopClient(); wg.Wait() })

	// next returns attempts in the order they end until one started at or
	// after since is served by via (within limit), counting the errors of
	// attempts started at or after since.
	seen := map[netip.Addr]string{} // client address → its backend
	next := func(since time.Time, via string, limit time.Duration) (first attempt, errs []attempt) {
		t.Helper()
		timeout := time.After(limit)
		others := map[string]int{}
		for {
			select {
			case a := <-results:
				if a.err == nil {
					if b, ok := seen[a.from]; ok && b != a.backend {
						t.Errorf("client %s reached %s through %s, and %s before", a.from, a.backend, a.via, b)
					}
					seen[a.from] = a.backend
				}
				if a.start.Before(since) {
					continue
				}
				if a.err != nil {
					errs = append(errs, a)
					continue
				}
				if a.via == via {
					return a, errs
				}
				others[a.via]++
			case <-timeout:
				for _, ns := range []string{lb1, lb2} {
					out, _ := exec.Command("ip", "-n", ns, "-br", "addr", "show", "eth0").CombinedOutput()
					t.Logf("%s", out)
				}
				t.Fatalf("no connection through %s within %v; %d errors since, the last: %v; served by others since: %v", via, limit, len(errs), lastErr(errs), others)
			}
		}
	}
	// steady checks that the attempts started in the next d all succeed
	// through via.
	steady := func(via string, d time.Duration) {
		t.Helper()
		from := time.Now()
		until := from.Add(d)
		for {
			a, errs := next(from, via, d+10*time.Second)
			if len(errs) > 0 {
				t.Errorf("%d connections failed while %s held the address: %v", len(errs), via, lastErr(errs))
			}
			if a.start.After(until) {
				return
			}
		}
	}

	start := time.Now()
	first, _ := next(start, "10.77.0.11", 30*time.Second)
	t.Logf("lb1 holds the address %v after keepalived started", first.end.Sub(start).Round(time.Millisecond))
	steady("10.77.0.11", time.Second)

	drain := func(args ...string) {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", lb1, os.Args[0], "drain", "-admin", admin}, args...)...)
		cmd.Env = append(os.Environ(), "FULCRUM_TEST_MAIN=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("fulcrum drain %v: %v: %s", args, err, out)
		}
	}

	// 1. Drain lb1: the address moves and no new connection fails.
	t0 := time.Now()
	drain()
	f1.await(t, logDraining)
	a, errs := next(t0, "10.77.0.12", 30*time.Second)
	drainMove := a.end.Sub(t0)
	if len(errs) > 0 {
		t.Errorf("%d connections failed while lb1 drained; the last: %v", len(errs), lastErr(errs))
	}
	steady("10.77.0.12", time.Second)

	// 2. Undrain lb1: it takes the address back (it has the higher priority).
	t1 := time.Now()
	drain("-undo")
	a, errs = next(t1, "10.77.0.11", 30*time.Second)
	undrainMove := a.end.Sub(t1)
	if len(errs) > 0 {
		t.Errorf("%d connections failed while lb1 took the address back; the last: %v", len(errs), lastErr(errs))
	}
	steady("10.77.0.11", time.Second)

	// 3. Stop lb1's fulcrum: refused until the address moves, then nothing fails.
	t2 := time.Now()
	f1.cmd.Process.Signal(syscall.SIGTERM)
	a, errs = next(t2, "10.77.0.12", 30*time.Second)
	stopMove := a.end.Sub(t2)
	var lastFail time.Duration
	for _, e := range errs {
		lastFail = max(lastFail, e.end.Sub(t2))
	}
	steady("10.77.0.12", 2*time.Second)
	select {
	case <-f1.exit:
	case <-time.After(10 * time.Second):
		t.Error("lb1's fulcrum did not exit after SIGTERM")
	}

	t.Logf("drain: the address moved to lb2 in %v, 0 connections failed", drainMove.Round(time.Millisecond))
	t.Logf("undrain: back to lb1 in %v, 0 connections failed", undrainMove.Round(time.Millisecond))
	t.Logf("stop: new connections succeed through lb2 %v after SIGTERM; %d failed before that, the last %v after SIGTERM, none since",
		stopMove.Round(time.Millisecond), len(errs), lastFail.Round(time.Millisecond))
	t.Logf("client addresses and their backend, the same through both instances: %v", seen)
	for _, d := range []time.Duration{drainMove, undrainMove, stopMove} {
		if d > 15*time.Second {
			t.Errorf("a failover took %v; want well under 15s (checks every 1s, fall 2, advert_int 1)", d)
		}
	}
	if len(seen) != len(clients) || len(distinct(seen)) < 2 {
		t.Errorf("clients and backends: %v; want every client served, by both backends", seen)
	}
}

// connectVia connects from the client namespace, from address from, and
// reads the greeting.
func connectVia(ns string, from netip.Addr, to string) attempt {
	a := attempt{start: time.Now(), from: from}
	var c net.Conn
	a.err = inNetns(ns, func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", to)
		return err
	})
	if a.err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var line string
		line, a.err = bufio.NewReader(c).ReadString('\n')
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		if f := strings.Fields(line); a.err == nil && len(f) == 2 {
			a.backend, a.via = f[0], f[1]
		} else if a.err == nil {
			a.err = fmt.Errorf("greeting %q", line)
		}
	}
	a.end = time.Now()
	return a
}

func lastErr(errs []attempt) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[len(errs)-1].err
}

func distinct(m map[netip.Addr]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range m {
		out[v] = true
	}
	return out
}
