package e2e

// The helpers of every test here: the binary and its commands, the daemon
// as a child process and its log, processes and descriptors seen through
// /proc, the admin listener, systemd's notify socket, and network-namespace
// labs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// bin is the fulcrum binary TestMain built for every test of the package.
var bin string

// TestMain builds fulcrum once, with the race detector when the tests have
// it, so that the daemon they start is checked as they are.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fulcrum-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "fulcrum")
	if err := build(bin, raceEnabled); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if raceEnabled {
		// The race runtime sleeps 1 s at exit by default, which every
		// command and every daemon's stop would wait through; a report it
		// makes still fails the process (exit status 66).
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the module's root package to out, with -race if race.
func build(out string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool(), append(args, "fulcrum")...)
	cmd.Dir = "../.." // the module root: go build finds go.mod from here
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// goTool is the go command: the one on PATH, else the one of the
// toolchain that built this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// plainBinary is fulcrum without the race detector, for tests that
// measure the daemon's memory: the race runtime's shadow memory would be
// measured with it. It is bin unless that is a race build.
var plainBinary = sync.OnceValues(func() (string, error) {
	if !raceEnabled {
		return bin, nil
	}
	out := bin + "-norace"
	return out, build(out, false)
})

// cli runs a fulcrum command (status, drain, -check…) to its end and
// returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	default:
		fmt.Fprintln(stderr, err)
		return -1
	}
}

// The messages of the instance's drain state.
const (
	logDraining  = "instance draining: /healthz fails, connections are still served"
	logUndrained = "instance undrained: /healthz follows the backends again"
	logStopping  = "instance stopping: /healthz fails until exit"
)

// writeFile writes text to a file called name in a new temporary
// directory and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// replaceFile writes data next to path and renames it over path, as
// consul-template's atomic write does.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fulcrum.toml.*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// daemon is fulcrum running as a child process.
type daemon struct {
	cmd   *exec.Cmd
	lines chan map[string]any // its JSON log lines
	exit  chan struct{}       // closed when the process has exited
	err   error               // its exit status, once exit is closed

	mu    sync.Mutex // protects other
	other []string   // stderr lines that are not JSON
}

// notJSON returns the stderr lines so far that are not JSON objects.
func (d *daemon) notJSON() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.other)
}

// startDaemon runs fulcrum -config on a file holding config, with extra
// environment.
func startDaemon(t *testing.T, config string, env ...string) *daemon {
	t.Helper()
	return startDaemonArgs(t, []string{"-config", writeFile(t, "fulcrum.toml", config)}, env, nil)
}

// startDaemonArgs runs fulcrum with args (or, when args
// start with "-c", a shell with them), extra environment, and extra files
// as descriptors 3, 4, ….
func startDaemonArgs(t *testing.T, args, env []string, files []*os.File) *daemon {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if args[0] == "-c" {
		cmd = exec.Command("/bin/sh", args...)
	}
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = files
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, lines: make(chan map[string]any, 1000), exit: make(chan struct{})}
	go func() { // exits when the child closes stderr
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				d.mu.Lock()
				d.other = append(d.other, sc.Text())
				d.mu.Unlock()
				continue
			}
			select {
			case d.lines <- m:
			default: // nobody is reading; drop
			}
		}
		close(d.lines)
		d.err = cmd.Wait()
		close(d.exit)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-d.exit
	})
	return d
}

// expectExit waits for the daemon to exit, with status 0.
func (d *daemon) expectExit(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-d.exit:
		if d.err != nil {
			t.Errorf("daemon exit: %v; want status 0", d.err)
		}
	case <-time.After(within):
		t.Fatalf("daemon did not exit within %v", within)
	}
}

// await returns the first log line with the given message. A line whose
// message is one of never fails the test.
func (d *daemon) await(t *testing.T, msg string, never ...string) map[string]any {
	t.Helper()
	return d.awaitMatch(t, fmt.Sprintf("%q", msg), func(m map[string]any) bool { return m["message"] == msg }, never...)
}

// adminAddr waits for the admin listener and returns its address. The
// daemon logs it before any listenAddr line: ask for it first.
func (d *daemon) adminAddr(t *testing.T) string {
	t.Helper()
	return d.await(t, "admin listening: /metrics /status /healthz /drain")["addr"].(string)
}

// listenAddr waits for the next listener to be bound and returns its address.
func (d *daemon) listenAddr(t *testing.T) string {
	t.Helper()
	return d.await(t, "listening")["addr"].(string)
}

// awaitMatch returns the first log line for which match is true (what
// describes it in a failure). A line whose message is one of never fails
// the test.
func (d *daemon) awaitMatch(t *testing.T, what string, match func(map[string]any) bool, never ...string) map[string]any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m, ok := <-d.lines:
			if !ok {
				t.Fatalf("daemon exited before logging %s", what)
			}
			for _, n := range never {
				if m["message"] == n {
					t.Errorf("logged %q before %s: %v", n, what, m)
				}
			}
			if match(m) {
				return m
			}
		case <-timeout:
			t.Fatalf("daemon did not log %s within 10s", what)
		}
	}
}

// awaitPrefix returns the first log line whose message starts with prefix.
func (d *daemon) awaitPrefix(t *testing.T, prefix string) map[string]any {
	t.Helper()
	return d.awaitMatch(t, fmt.Sprintf("%q…", prefix), func(m map[string]any) bool {
		msg, _ := m["message"].(string)
		return strings.HasPrefix(msg, prefix)
	})
}

// fdKinds counts process pid's descriptors by kind: sockets and pipes (fds
// above 2, as for pipes).
func fdKinds(t *testing.T, pid int) (sockets, pipeFDs int) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "0" || e.Name() == "1" || e.Name() == "2" {
			continue
		}
		l, _ := os.Readlink(dir + "/" + e.Name())
		switch {
		case strings.HasPrefix(l, "socket:"):
			sockets++
		case strings.HasPrefix(l, "pipe:"):
			pipeFDs++
		}
	}
	return sockets, pipeFDs
}

// lowestFreeFD is the descriptor number process pid would get next. With
// RLIMIT_NOFILE set to it, opening any descriptor fails with EMFILE.
func lowestFreeFD(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range ents {
		used[e.Name()] = true
	}
	n := 0
	for used[fmt.Sprint(n)] {
		n++
	}
	return n
}

// procState returns the state letter of /proc/pid/stat (R, S, Z…) and
// the process group, or 0 when the process is gone.
func procState(pid int) (state byte, pgrp int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// pid (comm) state ppid pgrp …: comm may hold spaces, so read after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0
	}
	pgrp, _ = strconv.Atoi(f[2])
	return f[0][0], pgrp
}

// daemonPIDs returns the live (not zombie) processes whose command line
// holds arg: the daemons of one test, named by their unique config path.
func daemonPIDs(t *testing.T, arg string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmd, []byte("\x00"+arg+"\x00")) {
			continue
		}
		if s, _ := procState(pid); s == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// awaitExited waits until pid is a zombie or gone.
func awaitExited(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if s, _ := procState(pid); s == 'Z' || s == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running after %v", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reap waits for pid, an orphan this process adopted as subreaper, and
// returns its wait status.
func reap(t *testing.T, pid int, within time.Duration) syscall.WaitStatus {
	t.Helper()
	done := make(chan syscall.WaitStatus, 1)
	go func() { // exits when pid does: the caller has signalled it, or SIGKILL below
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, syscall.ECHILD) {
				// Not adopted yet (its parent is still exiting), or reaped
				// elsewhere: wait for it to be gone instead, and look again.
				for s, _ := procState(pid); s != 0 && s != 'Z'; s, _ = procState(pid) {
					time.Sleep(20 * time.Millisecond)
				}
				if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != nil {
					ws = 0 // not ours to reap: gone is all that can be said
				}
				break
			}
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		done <- ws
	}()
	select {
	case ws := <-done:
		return ws
	case <-time.After(within):
		syscall.Kill(pid, syscall.SIGKILL)
		<-done
		t.Fatalf("process %d did not exit within %v", pid, within)
		return 0
	}
}

// becomeSubreaper makes this test process the parent of the daemons that an
// upgrade leaves behind when the old one exits, as systemd is for a
// service, so that the test can wait for them. It is undone when the test
// ends (its cleanup runs last: call it first): left on, it would make this
// process the parent of every orphan of the tests that follow, which
// nobody reaps, and their process groups would never empty. The tests
// that call it do not run in parallel, so no other test's orphans come
// meanwhile.
func becomeSubreaper(t *testing.T) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
}

// groupGone polls until no process is left in process group -pg, for at
// most d: a process exits without an event its non-parent can wait on.
func groupGone(pg int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; {
		if !groupLives(-pg) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupLives reports whether a process of group pgid is alive: a zombie
// does not count, since one that its parent left to init waits for init to
// reap it, which this machine's init does in its own time.
func groupLives(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		if s, g := procState(pid); g == pgid && s != 0 && s != 'Z' && s != 'X' {
			return true
		}
	}
	return false
}

// client is for the admin listener: bounded, as fulcrum's own commands are.
var client = http.Client{Timeout: 10 * time.Second}

// get fetches http://addr+path and returns the status code and body.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// greet connects through the balancer and returns the backend's greeting.
func greet(t *testing.T, lb string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", lb, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("greeting: %v", err)
	}
	return strings.TrimSpace(line)
}

// notifySocket plays systemd: a unixgram socket that collects sd_notify
// messages.
type notifySocket struct {
	path string
	msgs chan string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	dir, err := os.MkdirTemp("", "sd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &notifySocket{path: filepath.Join(dir, "notify"), msgs: make(chan string, 1000)}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // exits when the cleanup closes c
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return n
}

// next returns the next message that is not a watchdog ping, counting the
// pings it skips.
func (n *notifySocket) next(t *testing.T, pings *int) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-n.msgs:
			if strings.HasPrefix(m, "WATCHDOG=1") {
				*pings++
				continue
			}
			return m
		case <-timeout:
			t.Fatal("no sd_notify message within 10s")
		}
	}
}

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

// needProgram returns the path of a program, skipping the test where it is
// missing outside CI (.ci/run installs it).
func needProgram(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skipUnlessCI(t, name+" is not installed (.ci/run installs it)")
	}
	return p
}

// skipUnlessCI skips the test for why, except in CI (CI=true), where what
// is missing is a broken CI machine: there it fails.
func skipUnlessCI(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI must run this test", why)
	}
	t.Skip(why)
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
