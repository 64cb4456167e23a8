package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// keepalivedNode is what docs/keepalived/keepalived.conf.tmpl needs.
type keepalivedNode struct {
	Name, Interface, State, VIP, Healthz string
	Priority, VirtualRouterID            int
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
	t.Parallel() // mostly waiting on timers; its namespaces are its own
	l := newLab(t, "vrrp")
	for _, tool := range []string{"keepalived", "curl"} {
		needProgram(t, tool)
	}
	const (
		vip   = "10.77.0.100"
		admin = "127.0.0.1:9900" // each namespace has its own loopback
	)
	be := l.host(t, "be", "10.77.0.21/24", "10.77.0.22/24")
	lb1 := l.host(t, "lb1", "10.77.0.11/24")
	lb2 := l.host(t, "lb2", "10.77.0.12/24")
	clients, cidrs := subnetHosts(10, 77, 0, 2, 8)
	cl := l.host(t, "cl", cidrs...)

	// The same fulcrum file for both: the virtual address is bound before
	// it is here ([cluster] freebind), so the backup starts like the active.
	config := labConfig(t, be, "10.77.0", admin, vip+":80", "[cluster]\nfreebind = true")
	f1, _ := fulcrumIn(t, lb1, config), fulcrumIn(t, lb2, config)

	dir := t.TempDir()
	os.Chmod(dir, 0o755) // enable_script_security checks the path of what it runs
	for i, node := range []keepalivedNode{
		{Name: "lb1", State: "MASTER", Priority: 150},
		{Name: "lb2", State: "BACKUP", Priority: 100},
	} {
		node.Interface, node.VIP, node.VirtualRouterID, node.Healthz = "eth0", vip+"/24", 51, "http://"+admin+"/healthz"
		conf := filepath.Join(dir, node.Name+".conf")
		renderFile(t, "../../docs/keepalived/keepalived.conf.tmpl", conf, node)
		ns := []string{lb1, lb2}[i]
		start(t, ns, "keepalived", "--dont-fork", "--log-console", "--log-detail", "--no-syslog", "--vrrp",
			"-f", conf, "-p", filepath.Join(dir, node.Name+".pid"), "-r", filepath.Join(dir, node.Name+"-vrrp.pid"))
	}

	p := startProber(t, cl, clients, vip+":80")
	p.diag = func() {
		for _, ns := range []string{lb1, lb2} {
			out, _ := exec.Command("ip", "-n", ns, "-br", "addr", "show", "eth0").CombinedOutput()
			t.Logf("%s", out)
		}
	}
	const quiet = 2 * time.Second // of connections through one instance only, to call the address settled

	begin := time.Now()
	first, _ := p.settle(t, begin, "10.77.0.11", quiet, 30*time.Second) // errors until the address is up
	t.Logf("lb1 holds the address %v after keepalived started", first.end.Sub(begin).Round(time.Millisecond))

	// 1. Drain lb1: the address moves and no new connection fails.
	t0 := time.Now()
	drainIn(t, lb1, admin)
	f1.await(t, logDraining)
	first, errs := p.settle(t, t0, "10.77.0.12", quiet, 30*time.Second)
	drainMove := first.end.Sub(t0)
	if len(errs) > 0 {
		t.Errorf("%d connections failed while lb1 drained; the last: %v", len(errs), lastErr(errs))
	}

	// 2. Undrain lb1: it takes the address back (it has the higher priority).
	t1 := time.Now()
	drainIn(t, lb1, admin, "-undo")
	first, errs = p.settle(t, t1, "10.77.0.11", quiet, 30*time.Second)
	undrainMove := first.end.Sub(t1)
	if len(errs) > 0 {
		t.Errorf("%d connections failed while lb1 took the address back; the last: %v", len(errs), lastErr(errs))
	}

	// 3. Stop lb1's fulcrum: refused until the address moves, then nothing fails.
	t2 := time.Now()
	f1.cmd.Process.Signal(syscall.SIGTERM)
	first, errs = p.settle(t, t2, "10.77.0.12", quiet, 30*time.Second)
	stopMove := first.end.Sub(t2)
	select {
	case <-f1.exit:
	case <-time.After(10 * time.Second):
		t.Error("lb1's fulcrum did not exit after SIGTERM")
	}

	t.Logf("drain: the address moved to lb2 in %v, 0 connections failed", drainMove.Round(time.Millisecond))
	t.Logf("undrain: back to lb1 in %v, 0 connections failed", undrainMove.Round(time.Millisecond))
	t.Logf("stop: new connections succeed through lb2 %v after SIGTERM; %d failed before that (%v), none in the %v after",
		stopMove.Round(time.Millisecond), len(errs), lastErr(errs), quiet)
	t.Logf("client addresses and their backend, the same through both instances: %v", p.seen)
	for _, d := range []time.Duration{drainMove, undrainMove, stopMove} {
		if d > 15*time.Second {
			t.Errorf("a failover took %v; want well under 15s (checks every 1s, fall 2, advert_int 1)", d)
		}
	}
	if len(p.seen) != len(clients) || len(distinct(p.seen)) < 2 {
		t.Errorf("clients and backends: %v; want every client served, by both backends", p.seen)
	}
}
