package e2e

// The daemon as a child process: starting it, its log, its exit, and
// processes and descriptors seen through /proc; systemd's notify socket.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

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
	testkit.WaitFor(t, within, func() error { // a non-parent gets no event when a process exits
		if s, _ := procState(pid); s != 'Z' && s != 0 {
			return fmt.Errorf("process %d: state %c; want exited", pid, s)
		}
		return nil
	})
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
	return testkit.Until(d, func() error {
		if groupLives(-pg) {
			return fmt.Errorf("process group %d lives", pg)
		}
		return nil
	}) == nil
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
