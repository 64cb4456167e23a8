package e2e

// Network-namespace labs: namespaces joined by veth pairs, the daemon and
// other programs run inside them, and probers that connect through them.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// fulcrumIn starts the daemon in namespace ns and waits until it listens.
func fulcrumIn(t *testing.T, ns, config string) *daemon {
	t.Helper()
	d := startDaemonArgs(t, []string{"-c", `exec ip netns exec "$1" "$0" -config "$2"`, bin, ns, config}, nil, nil)
	d.await(t, "listening")
	return d
}

// drainIn runs fulcrum drain (with args) in namespace ns.
func drainIn(t *testing.T, ns, admin string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin, "drain", "-admin", admin}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fulcrum drain %v in %s: %v: %s", args, ns, err, out)
	}
}

func distinct(m map[netip.Addr]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range m {
		out[v] = true
	}
	return out
}

// lab is a set of network namespaces a test made for itself, joined by veth
// pairs to a bridge in a namespace of its own: a private LAN whose addresses
// exist nowhere else. Nothing in it touches the host's interfaces: every
// veth is created straight into its namespaces. The test's cleanup deletes
// every namespace, which takes their interfaces with them.
type lab struct {
	prefix string // of every namespace's name: unique to this process
	lan    string // the namespace holding the bridge
}

// newLab makes the bridge namespace, or skips the test where network
// namespaces cannot be made (not root, no iproute2, EPERM in a container).
// tag tells this test's namespaces from those of others in the process.
func newLab(t *testing.T, tag string) *lab {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("network-namespace test (root, 25-30 s): skipped under -short")
	}
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skipUnlessCI(t, "iproute2's ip is not installed (.ci/run installs it)")
	}
	l := &lab{prefix: fmt.Sprintf("fulcrum-%d-%s-", os.Getpid(), tag)}
	out, err := exec.Command("ip", "netns", "add", l.prefix+"lan").CombinedOutput()
	if err != nil {
		if s := string(out); strings.Contains(s, "Operation not permitted") || strings.Contains(s, "Permission denied") ||
			strings.Contains(s, "Read-only file system") {
			t.Skipf("network namespaces are not permitted here: %s", strings.TrimSpace(s))
		}
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	l.lan = l.prefix + "lan"
	t.Cleanup(func() { exec.Command("ip", "netns", "del", l.lan).Run() })
	if out, err := exec.Command("ip", "-n", l.lan, "link", "add", "br0", "type", "bridge").CombinedOutput(); err != nil {
		t.Skipf("no bridge in a network namespace here: %v: %s", err, strings.TrimSpace(string(out)))
	}
	l.ip(t, "-n", l.lan, "link", "set", "br0", "up")
	return l
}

// ip runs iproute2's ip and fails the test on error.
func (l *lab) ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// ns adds a namespace with lo up and returns its name.
func (l *lab) ns(t *testing.T, name string) string {
	t.Helper()
	ns := l.prefix + name
	l.ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	l.ip(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// host adds a namespace plugged into the bridge through its eth0, with
// addrs (CIDR) on eth0, and returns its name.
func (l *lab) host(t *testing.T, name string, addrs ...string) string {
	t.Helper()
	ns := l.ns(t, name)
	l.ip(t, "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", name, "netns", l.lan)
	l.ip(t, "-n", l.lan, "link", "set", name, "master", "br0", "up")
	l.addrs(t, ns, "eth0", addrs...)
	return ns
}

// link joins namespaces a and b with a veth pair, interface ifname at both
// ends, with address aAddr on a's end and bAddrs on b's.
func (l *lab) link(t *testing.T, ifname, a, aAddr, b string, bAddrs ...string) {
	t.Helper()
	l.ip(t, "link", "add", ifname, "netns", a, "type", "veth", "peer", "name", ifname, "netns", b)
	l.addrs(t, a, ifname, aAddr)
	l.addrs(t, b, ifname, bAddrs...)
}

// addrs puts addresses (CIDR) on an interface of ns and sets it up.
func (l *lab) addrs(t *testing.T, ns, ifname string, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		l.ip(t, "-n", ns, "addr", "add", a, "dev", ifname)
	}
	l.ip(t, "-n", ns, "link", "set", ifname, "up")
}

// inNetns runs f on an OS thread that has entered namespace ns; a socket f
// creates belongs to ns for good, wherever it is used afterwards. The thread
// returns to the runtime only once it is back in this process's namespace;
// if that fails it stays locked and ends with its goroutine.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() { // exits when f returns
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(self)
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("back from netns %s: %w", ns, err) // locked: the thread ends with this goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// proc is a program the test runs inside a namespace, in a process group
// of its own so that its children (keepalived's VRRP process, its check
// scripts) are stopped with it.
type proc struct {
	cmd  *exec.Cmd
	out  *testkit.SyncBuffer
	done chan struct{} // closed when it has exited
}

// start runs argv in namespace ns; the test's cleanup stops the whole
// group: SIGTERM, then SIGKILL if it lingers.
func start(t *testing.T, ns string, argv ...string) *proc {
	t.Helper()
	p := &proc{out: &testkit.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }() // exits with the process
	t.Cleanup(func() {
		pg := -p.cmd.Process.Pid
		syscall.Kill(pg, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop on SIGTERM within 10s; killing its group", argv[0])
			syscall.Kill(pg, syscall.SIGKILL)
			<-p.done
		}
		// The rest of the group got the SIGTERM too; wait until the last
		// has gone and been reaped, and kill what lingers.
		if !groupGone(pg, 5*time.Second) {
			syscall.Kill(pg, syscall.SIGKILL)
			if !groupGone(pg, 5*time.Second) {
				t.Errorf("processes of %s's group outlived SIGKILL by 5s", argv[0])
			}
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", argv[0], p.out.String())
		}
	})
	return p
}

// attempt is one client connection through a shared (virtual or anycast)
// address.
type attempt struct {
	start, end time.Time
	from       netip.Addr
	via        string // the fulcrum instance that served it, as the backend saw it
	backend    string
	err        error
}

// greetVia is a backend handler that answers with its name and the address
// the connection came from: the fulcrum instance that proxied it.
func greetVia(name string) func(*net.TCPConn) {
	return func(c *net.TCPConn) {
		fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr().(*net.TCPAddr).IP)
	}
}

// renderFile renders the Go template at tmpl (a file of the repository)
// with data into path.
func renderFile(t *testing.T, tmpl, path string, data any) {
	t.Helper()
	tp, err := template.ParseFiles(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tp.Execute(f, data); err != nil {
		t.Fatalf("render %s: %v", tmpl, err)
	}
}

// labConfig starts backends be1 and be2 on subnet.21:7000 and
// subnet.22:7000 in namespace ns and writes the one fulcrum file every
// instance of a lab uses: mh over them on listen, the admin listener on
// admin, plus extra TOML. drain_timeout is short because a connection left
// on an instance when the address moves away never hears from its client
// again.
func labConfig(t *testing.T, ns, subnet, admin, listen, extra string) string {
	t.Helper()
	listenIn(t, ns, subnet+".21:7000", "be1")
	listenIn(t, ns, subnet+".22:7000", "be2")
	return writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
access = false
[admin]
listen = %q
%s
[services.app]
listen = [%q]
scheduler = "mh"
drain_timeout = "2s"
backends = [{ name = "be1", address = "%[4]s.21:7000" }, { name = "be2", address = "%[4]s.22:7000" }]
`, admin, extra, listen, subnet))
}

// listenIn starts a greetVia backend on addr inside namespace ns.
func listenIn(t *testing.T, ns, addr, name string) {
	t.Helper()
	var ln *net.TCPListener
	if err := inNetns(ns, func() error {
		c, err := net.Listen("tcp", addr)
		if err == nil {
			ln = c.(*net.TCPListener)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, ln, greetVia(name))
}

// prober is a client in a namespace that opens a connection to one address
// every 50ms, from each of its source addresses in turn, each bounded by a
// 5s connect and a 5s read timeout, at most 2,400 (two minutes) in all. The
// test's cleanup stops it and waits for every connection.
type prober struct {
	results chan attempt
	seen    map[netip.Addr]string // client address → the backend it reached; the test goroutine's
	diag    func()                // logs the state of the lab when a wait times out; may be nil
}

func startProber(t *testing.T, ns string, from []netip.Addr, to string) *prober {
	const most = 2400
	p := &prober{results: make(chan attempt, most), seen: map[netip.Addr]string{}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // exits when stop is called or after most attempts
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := range most {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() { // exits within the connect and read timeouts
				defer wg.Done()
				p.results <- connectVia(ns, from[i%len(from)], to)
			}()
		}
	}()
	t.Cleanup(func() { stop(); wg.Wait() })
	return p
}

// connectVia connects from namespace ns and address from, and reads the
// greeting.
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

// next returns the next attempt, in the order they end, that started at or
// after since. A client address must reach the same backend whichever
// instance serves it (mh).
func (p *prober) next(t *testing.T, since time.Time, timeout <-chan time.Time, waiting string) attempt {
	t.Helper()
	for {
		select {
		case a := <-p.results:
			if a.err == nil {
				if b, ok := p.seen[a.from]; ok && b != a.backend {
					t.Errorf("client %s reached %s through %s, and %s before", a.from, a.backend, a.via, b)
				}
				p.seen[a.from] = a.backend
			}
			if !a.start.Before(since) {
				return a
			}
		case <-timeout:
			if p.diag != nil {
				p.diag()
			}
			t.Fatalf("timed out waiting for %s", waiting)
		}
	}
}

// settle reads the attempts started at or after since until, for quiet,
// every one has succeeded through instance to and no other. It returns the
// first attempt of that run and every failed attempt before it.
func (p *prober) settle(t *testing.T, since time.Time, to string, quiet, limit time.Duration) (first attempt, errs []attempt) {
	t.Helper()
	timeout := time.After(limit)
	var run []attempt
	for {
		a := p.next(t, since, timeout, fmt.Sprintf("%v of connections through %s only; %d failed, the last: %v", quiet, to, len(errs), lastErr(errs)))
		switch {
		case a.err != nil:
			errs, run = append(errs, a), nil
		case a.via != to:
			run = nil
		default:
			run = append(run, a)
			if a.start.Sub(run[0].start) >= quiet {
				return run[0], errs
			}
		}
	}
}

// collect returns the next n attempts started at or after since.
func (p *prober) collect(t *testing.T, since time.Time, n int, limit time.Duration) []attempt {
	t.Helper()
	timeout := time.After(limit)
	out := make([]attempt, 0, n)
	for len(out) < n {
		out = append(out, p.next(t, since, timeout, fmt.Sprintf("%d connections", n)))
	}
	return out
}

func lastErr(errs []attempt) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[len(errs)-1].err
}

// subnetHosts returns n addresses a.b.c.first… and the same as /24 CIDRs.
func subnetHosts(a, b, c, first byte, n int) ([]netip.Addr, []string) {
	var addrs []netip.Addr
	var cidrs []string
	for i := range n {
		ip := netip.AddrFrom4([4]byte{a, b, c, first + byte(i)})
		addrs, cidrs = append(addrs, ip), append(cidrs, ip.String()+"/24")
	}
	return addrs, cidrs
}
