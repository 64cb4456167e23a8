package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// exchange sends one line on c and reads its echo.
func exchange(c net.Conn, line string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line {
		return fmt.Errorf("echo %q; want %q", got, line)
	}
	return nil
}

// loadResult counts what happened to the connections of a load run.
type loadResult struct {
	answered, refused, reset, other atomic.Int64
	slowest                         atomic.Int64 // nanoseconds: the longest dial plus exchange
	mu                              sync.Mutex   // protects errs
	errs                            []string     // the first few failures
}

func (r *loadResult) fail(err error) {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		r.refused.Add(1)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		r.reset.Add(1)
	default:
		r.other.Add(1)
	}
	r.mu.Lock()
	if len(r.errs) < 5 {
		r.errs = append(r.errs, err.Error())
	}
	r.mu.Unlock()
}

// load opens rate new connections a second to addr, n in all, each one
// short exchange, and closes mid once half of them have been started. It
// returns when every connection has ended.
func load(addr string, rate, n int, mid chan<- struct{}, r *loadResult) {
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		if i == n/2 {
			close(mid)
		}
		wg.Add(1)
		go func() { // exits when its exchange ends, within the 10 s deadlines
			defer wg.Done()
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				r.fail(err)
				return
			}
			defer c.Close()
			if err := exchange(c, fmt.Sprintf("request %d\n", i)); err != nil {
				r.fail(err)
				return
			}
			r.answered.Add(1)
			el := int64(time.Since(start))
			for s := r.slowest.Load(); el > s && !r.slowest.CompareAndSwap(s, el); s = r.slowest.Load() {
			}
		}()
	}
	wg.Wait()
}

// TestUpgradeUnderLoad: `fulcrum upgrade` while 500 new connections a
// second come in and 20 long ones are open. Every short connection is
// answered (none refused, none reset); the long ones that talk on are
// served by the old process to the end, those that stay silent are closed
// at its drain_timeout; systemd is told the new main PID and hears nothing
// more from the old process; the old one exits 0 and exactly one daemon is
// left, which serves.
func TestUpgradeUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("drives 3000 connections through two daemons")
	}
	const (
		rate, n = 500, 3000 // 6 s of load, the upgrade in the middle
		long    = 20
		drain   = 3 * time.Second
	)
	becomeSubreaper(t)
	be := testkit.NewServer(t, testkit.Echo).Addr
	ns := newNotifySocket(t)
	config := upgradeConfig(t, drain, be)
	d := startDaemonArgs(t, []string{"-config", config}, []string{"NOTIFY_SOCKET=" + ns.path, "WATCHDOG_USEC=2000000"}, nil)
	killOthers(t, config, d)
	adm := d.adminAddr(t)
	addr := d.listenAddr(t)
	pings := 0
	if m := ns.next(t, &pings); !strings.HasPrefix(m, "READY=1") {
		t.Fatalf("first sd_notify message %q; want READY=1", m)
	}

	conns := make([]net.Conn, long)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := exchange(c, fmt.Sprintf("long %d\n", i)); err != nil {
			t.Fatalf("long connection %d: %v", i, err)
		}
		conns[i] = c
	}

	var res loadResult
	mid := make(chan struct{})
	loaded := make(chan struct{})
	go func() { load(addr, rate, n, mid, &res); close(loaded) }() // exits when the n connections have ended
	<-mid
	var out, errb bytes.Buffer
	start := time.Now()
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 0 {
		<-loaded
		t.Fatalf("fulcrum upgrade = %d; stdout %q, stderr %q", code, out.String(), errb.String())
	}
	handed := time.Now()
	var newPID, oldPID int
	if _, err := fmt.Sscanf(out.String(), "upgraded: pid %d serves; pid %d drains", &newPID, &oldPID); err != nil || oldPID != d.cmd.Process.Pid {
		t.Fatalf("fulcrum upgrade printed %q (%v); want the new pid and %d", out.String(), err, d.cmd.Process.Pid)
	}
	t.Logf("upgrade took %v: pid %d → %d", handed.Sub(start), oldPID, newPID)

	// The long connections: even ones talk on through the old process,
	// odd ones stay silent until its drain_timeout closes them.
	var wg sync.WaitGroup
	errs := make(chan error, long)
	for i, c := range conns {
		wg.Add(1)
		go func() { // exits when its connection ends
			defer wg.Done()
			if i%2 == 0 {
				if err := exchange(c, fmt.Sprintf("after %d\n", i)); err != nil {
					errs <- fmt.Errorf("long connection %d after the upgrade: %v", i, err)
				}
				c.Close()
				return
			}
			c.SetDeadline(time.Now().Add(drain + 10*time.Second))
			if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
				errs <- fmt.Errorf("long connection %d at the drain: %q, %v; want a clean close", i, rest, err)
			}
			if el := time.Since(handed); el > drain+2*time.Second {
				errs <- fmt.Errorf("long connection %d closed %v after the upgrade; want by drain_timeout %v", i, el, drain)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	<-loaded
	slowest := time.Duration(res.slowest.Load())
	t.Logf("%d answered, %d refused, %d reset, %d other; slowest %v", res.answered.Load(), res.refused.Load(), res.reset.Load(), res.other.Load(), slowest)
	if slowest >= drain {
		t.Errorf("a connection took %v; want none waiting for the old process's drain (%v)", slowest, drain)
	}
	if res.answered.Load() != n || res.refused.Load() != 0 || res.reset.Load() != 0 {
		t.Errorf("%d of %d answered, %d refused, %d reset, %d other (%q); want all answered", res.answered.Load(), n, res.refused.Load(), res.reset.Load(), res.other.Load(), res.errs)
	}

	awaitExited(t, oldPID, drain+10*time.Second)
	if pids := daemonPIDs(t, config); len(pids) != 1 || pids[0] != newPID {
		t.Fatalf("daemons left: %v; want only the new one, %d", pids, newPID)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := exchange(c, "the new one serves\n"); err != nil {
		t.Errorf("after the old process exited: %v", err)
	}
	c.Close()
	if code, body := get(t, adm, "/healthz"); code != 200 {
		t.Errorf("new process /healthz = %d %q", code, body)
	}

	// systemd heard MAINPID= from the old process and nothing else after
	// it (no STOPPING=1: the service did not stop).
	var after []string
	sawMain := false
	for len(ns.msgs) > 0 {
		switch m := <-ns.msgs; {
		case strings.HasPrefix(m, "MAINPID="+strconv.Itoa(newPID)+"\n"):
			sawMain = true
		case strings.HasPrefix(m, "WATCHDOG=1"):
		case sawMain:
			after = append(after, m)
		}
	}
	if !sawMain {
		t.Errorf("no MAINPID=%d message", newPID)
	}
	if len(after) > 0 {
		t.Errorf("after MAINPID=: %q; want only watchdog pings", after)
	}

	syscall.Kill(newPID, syscall.SIGTERM)
	if m := ns.next(t, &pings); m != "STOPPING=1" {
		t.Errorf("sd_notify on stopping the new process: %q; want STOPPING=1", m)
	}
	if ws := reap(t, newPID, 10*time.Second); ws.ExitStatus() != 0 {
		t.Errorf("new process exit status %d; want 0", ws.ExitStatus())
	}
	d.expectExit(t, 10*time.Second) // the old one's status, read once every daemon has closed stderr
}

// TestUpgradeFailureKeepsServing: a new binary that exits at once fails the
// upgrade (exit status 1, the reason, a log line), and the old process
// serves on, alone, its connections untouched; once a good binary is
// installed the next upgrade succeeds, and the new process can upgrade in
// turn.
func TestUpgradeFailureKeepsServing(t *testing.T) {
	becomeSubreaper(t)
	dir := t.TempDir()
	installed := filepath.Join(dir, "fulcrum")
	install := func(src string) { // as install(1) or dpkg do: a new file renamed over the old
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(installed+".new", data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(installed+".new", installed); err != nil {
			t.Fatal(err)
		}
	}
	install(bin)
	be := testkit.NewServer(t, testkit.Echo).Addr
	config := upgradeConfig(t, time.Second, be)
	d := startDaemonArgs(t, []string{"-c", `exec "$0" "$@"`, installed, "-config", config}, nil, nil)
	killOthers(t, config, d)
	adm := d.adminAddr(t)
	addr := d.listenAddr(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := exchange(c, "before\n"); err != nil {
		t.Fatal(err)
	}

	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	install(broken)
	var out, errb bytes.Buffer
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "exited before it was ready: exit status 3") {
		t.Errorf("fulcrum upgrade with a broken binary = %d, stderr %q; want 1 and why", code, errb.String())
	}
	if m := d.await(t, "upgrade failed; this process serves on"); !strings.Contains(m["error"].(string), "exit status 3") {
		t.Errorf("log line %v; want the exit status", m)
	}
	if pids := daemonPIDs(t, config); len(pids) != 1 || pids[0] != d.cmd.Process.Pid {
		t.Errorf("daemons after the failed upgrade: %v; want only %d", pids, d.cmd.Process.Pid)
	}
	if err := exchange(c, "during\n"); err != nil {
		t.Errorf("open connection after the failed upgrade: %v", err)
	}
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := exchange(c2, "new\n"); err != nil {
		t.Errorf("new connection after the failed upgrade: %v", err)
	}

	install(bin)
	out.Reset()
	errb.Reset()
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 0 {
		t.Fatalf("fulcrum upgrade with a good binary = %d, stderr %q", code, errb.String())
	}
	var newPID int
	fmt.Sscanf(out.String(), "upgraded: pid %d", &newPID)
	if err := exchange(c, "drained\n"); err != nil {
		t.Errorf("open connection during the drain: %v", err)
	}
	c.Close()
	c2.Close()
	awaitExited(t, d.cmd.Process.Pid, 10*time.Second)
	if pids := daemonPIDs(t, config); len(pids) != 1 || pids[0] != newPID {
		t.Errorf("daemons after the upgrade: %v; want only %d", pids, newPID)
	}

	// The new process upgrades in turn: nothing of the first handover
	// (LISTEN_*, the pipe's variable) lingers in its environment.
	out.Reset()
	errb.Reset()
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 0 {
		t.Fatalf("second upgrade = %d, stderr %q", code, errb.String())
	}
	var third, from int
	fmt.Sscanf(out.String(), "upgraded: pid %d serves; pid %d drains", &third, &from)
	if from != newPID {
		t.Errorf("second upgrade: %q; want pid %d to drain", out.String(), newPID)
	}
	if ws := reap(t, newPID, 10*time.Second); ws.ExitStatus() != 0 { // no connection: it exits at once
		t.Errorf("second process exit status %d; want 0", ws.ExitStatus())
	}
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := exchange(c3, "third\n"); err != nil {
		t.Errorf("through the third process: %v", err)
	}
	c3.Close()
	if pids := daemonPIDs(t, config); len(pids) != 1 || pids[0] != third {
		t.Errorf("daemons after the second upgrade: %v; want only %d", pids, third)
	}
	syscall.Kill(third, syscall.SIGTERM)
	if ws := reap(t, third, 10*time.Second); ws.ExitStatus() != 0 {
		t.Errorf("third process exit status %d; want 0", ws.ExitStatus())
	}
	d.expectExit(t, 10*time.Second)
}

// fdStore plays systemd's notify socket with FileDescriptorStoreMax= set:
// it keeps the descriptors sent with FDSTORE=1 under their FDNAME= and
// drops them on FDSTOREREMOVE=1.
type fdStore struct {
	path string
	msgs chan string // every message's text
	mu   sync.Mutex  // protects fds
	fds  map[string]*os.File
}

func newFDStore(t *testing.T) *fdStore {
	t.Helper()
	dir, err := os.MkdirTemp("", "sd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &fdStore{path: filepath.Join(dir, "notify"), msgs: make(chan string, 1000), fds: map[string]*os.File{}}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // exits when the cleanup closes c
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*16))
		for {
			k, ok, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			msg := string(buf[:k])
			var fds []int
			if cms, err := unix.ParseSocketControlMessage(oob[:ok]); err == nil {
				for _, cm := range cms {
					if r, err := unix.ParseUnixRights(&cm); err == nil {
						fds = append(fds, r...)
					}
				}
			}
			name := ""
			for _, kv := range strings.Split(msg, "\n") {
				if v, ok := strings.CutPrefix(kv, "FDNAME="); ok {
					name = v
				}
			}
			s.mu.Lock()
			switch {
			case strings.HasPrefix(msg, "FDSTORE=1") && len(fds) == 1:
				if old := s.fds[name]; old != nil {
					old.Close()
				}
				s.fds[name] = os.NewFile(uintptr(fds[0]), name)
				fds = nil
			case strings.HasPrefix(msg, "FDSTOREREMOVE=1"):
				if old := s.fds[name]; old != nil {
					old.Close()
				}
				delete(s.fds, name)
			}
			s.mu.Unlock()
			for _, fd := range fds { // not kept
				unix.Close(fd)
			}
			s.msgs <- msg
		}
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
		for _, f := range s.fds {
			f.Close()
		}
	})
	return s
}

// awaitReady returns once a READY=1 message has come.
func (s *fdStore) awaitReady(t *testing.T) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-s.msgs:
			if strings.HasPrefix(m, "READY=1") {
				return
			}
		case <-timeout:
			t.Fatal("no READY=1 within 10s")
		}
	}
}

// names returns the stored names, sorted.
func (s *fdStore) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.fds {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestRestartKeepsFDStore plays `systemctl restart` of a unit with
// FileDescriptorStoreMax= and no socket unit: fulcrum stores the sockets it
// bound (the admin one too), and removes one a reload drops; connections
// made while the old process drains and before the new one starts are
// queued, not refused, and the new process, given the store in
// LISTEN_FDS, serves them on the same ports.
func TestRestartKeepsFDStore(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo).Addr
	st := newFDStore(t)
	config := func(extra string) string {
		return fmt.Sprintf("[log]\nformat = \"json\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[services.s]\nlisten = [\"127.0.0.1:0\"%s]\ndrain_timeout = \"1s\"\nbackends = [{ address = %q }]\n", extra, be)
	}
	path := writeFile(t, "fulcrum.toml", config(`, "127.0.0.2:0"`))
	d := startDaemonArgs(t, []string{"-config", path}, []string{"NOTIFY_SOCKET=" + st.path, "FDSTORE=8"}, nil)
	adm := d.adminAddr(t)
	st.awaitReady(t)
	want := []string{"fulcrum.admin.127.0.0.1_0", "fulcrum.listen.127.0.0.1_0", "fulcrum.listen.127.0.0.2_0"}
	if got := st.names(); !slices.Equal(got, want) {
		t.Fatalf("stored %q; want %q", got, want)
	}
	replaceFile(t, path, []byte(config("")))
	st.awaitReady(t)
	if got := st.names(); !slices.Equal(got, want[:2]) {
		t.Fatalf("stored after a reload removed a listener: %q; want %q", got, want[:2])
	}
	addr := d.awaitMatch(t, "listening on 127.0.0.1", func(m map[string]any) bool {
		a, _ := m["addr"].(string)
		return m["message"] == "listening" && strings.HasPrefix(a, "127.0.0.1:")
	})["addr"].(string)

	long, err := net.Dial("tcp", addr) // keeps the old process draining for its drain_timeout
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	if err := exchange(long, "long\n"); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.await(t, "stopped accepting; draining connections")
	const n = 20
	queued := make([]net.Conn, n)
	for i := range queued {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d while the old process drains: %v; want it queued", i, err)
		}
		defer c.Close()
		fmt.Fprintf(c, "queued %d\n", i)
		queued[i] = c
	}
	d.expectExit(t, 10*time.Second)
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
		t.Fatalf("while no process runs: %v; want it queued", err)
	} else {
		c.Close()
	}

	// systemd starts the next process with the store in LISTEN_FDS.
	st.mu.Lock()
	var names []string
	var files []*os.File
	for _, name := range want[:2] {
		names = append(names, name)
		files = append(files, st.fds[name])
	}
	st.mu.Unlock()
	next := startDaemonArgs(t, []string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin, "-config", path},
		[]string{"LISTEN_FDS=" + strconv.Itoa(len(files)), "LISTEN_FDNAMES=" + strings.Join(names, ":")}, files)
	if got := next.adminAddr(t); got != adm {
		t.Errorf("the next process's admin listens on %s; want the stored %s", got, adm)
	}
	for i, c := range queued {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != fmt.Sprintf("queued %d\n", i) {
			t.Errorf("queued connection %d: %q, %v; want it served by the next process", i, line, err)
		}
	}
	next.cmd.Process.Signal(syscall.SIGTERM)
	next.expectExit(t, 10*time.Second)
}

// TestUpgradeKeepsSystemdSockets: a socket systemd passed under a
// FileDescriptorName= is passed on under that name, so the new process
// serves it for the service of that name, and it stays systemd's: the new
// process adopts it as passed by systemd, not as its own.
func TestUpgradeKeepsSystemdSockets(t *testing.T) {
	becomeSubreaper(t)
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	ln, err := net.Listen("tcp", "127.0.0.1:0") // held by "systemd"
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	config := upgradeConfig(t, time.Second, be)
	d := startDaemonArgs(t, []string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin, "-config", config},
		[]string{"LISTEN_FDS=1", "LISTEN_FDNAMES=s"}, []*os.File{f})
	killOthers(t, config, d)
	adm := d.adminAddr(t)
	greet := func(what string) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); line != "a\n" {
			t.Fatalf("%s: %q, %v; want the service's greeting", what, line, err)
		}
	}
	greet("before the upgrade")
	f.Close()
	var out, errb bytes.Buffer
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 0 {
		t.Fatalf("fulcrum upgrade = %d, stderr %q", code, errb.String())
	}
	var newPID int
	fmt.Sscanf(out.String(), "upgraded: pid %d", &newPID)
	m := d.awaitMatch(t, "the new process adopts the socket as systemd's", func(m map[string]any) bool {
		return m["message"] == "socket passed by systemd" && m["name"] == "s"
	})
	if m["addr"] != ln.Addr().String() {
		t.Errorf("adopted %v; want %s", m["addr"], ln.Addr())
	}
	awaitExited(t, d.cmd.Process.Pid, 10*time.Second)
	greet("after the old process exited")
	syscall.Kill(newPID, syscall.SIGTERM)
	if ws := reap(t, newPID, 10*time.Second); ws.ExitStatus() != 0 {
		t.Errorf("new process exit status %d; want 0", ws.ExitStatus())
	}
	d.expectExit(t, 10*time.Second)
}

// upgradeConfig writes the file the upgrade tests run: a JSON log, an
// admin listener, and service s over be, drained for at most drain.
func upgradeConfig(t *testing.T, drain time.Duration, be string) string {
	t.Helper()
	return writeFile(t, "fulcrum.toml", fmt.Sprintf(`[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = %q
backends = [{ address = %q }]
`, drain, be))
}

// killOthers kills and reaps, when the test ends, every daemon of config
// but d: the successor an upgrade started, or one a failed test left
// behind. Call it after startDaemonArgs, so that it runs before that
// one's cleanup, whose stderr reader ends only when every daemon is gone.
func killOthers(t *testing.T, config string, d *daemon) {
	t.Cleanup(func() {
		for _, pid := range daemonPIDs(t, config) {
			if pid != d.cmd.Process.Pid {
				syscall.Kill(pid, syscall.SIGKILL)
				reap(t, pid, 10*time.Second)
			}
		}
	})
}
