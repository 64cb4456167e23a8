package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2's ip is not installed")
	}
	l := &lab{prefix: fmt.Sprintf("fulcrum-%d-", os.Getpid())}
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

// host adds a namespace plugged into the bridge through its eth0, with lo
// up and addrs (CIDR) on eth0, and returns its name.
func (l *lab) host(t *testing.T, name string, addrs ...string) string {
	t.Helper()
	ns := l.prefix + name
	l.ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	l.ip(t, "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", name, "netns", l.lan)
	l.ip(t, "-n", l.lan, "link", "set", name, "master", "br0", "up")
	l.ip(t, "-n", ns, "link", "set", "lo", "up")
	for _, a := range addrs {
		l.ip(t, "-n", ns, "addr", "add", a, "dev", "eth0")
	}
	l.ip(t, "-n", ns, "link", "set", "eth0", "up")
	return ns
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
	out  *syncBuffer
	done chan struct{} // closed when it has exited
}

// start runs argv in namespace ns; the test's cleanup stops the whole
// group: SIGTERM, then SIGKILL if it lingers.
func start(t *testing.T, ns string, argv ...string) *proc {
	t.Helper()
	p := &proc{out: &syncBuffer{}, done: make(chan struct{})}
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
		// Children that outlived the leader (none should): the group goes too.
		if err := syscall.Kill(pg, syscall.SIGKILL); err == nil {
			t.Errorf("%s left processes behind in its group", argv[0])
		} else if !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kill group of %s: %v", argv[0], err)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", argv[0], p.out.String())
		}
	})
	return p
}
