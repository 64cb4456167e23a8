package systemd

// A binary upgrade, done the way nginx does its USR2 upgrade but reported
// to systemd: the running process starts the new binary with its
// listening sockets in LISTEN_FDS, waits until the new process says it is
// ready on a pipe, and only then tells systemd the new main PID. The new
// process adopts the sockets through Listeners, as it would sockets from
// systemd; LISTEN_PID cannot name it (os.StartProcess gives no hook
// between fork and exec), so it names the parent, and UpgradeEnv marks the
// handoff.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// UpgradeEnv carries, to a process started by Upgrade, the descriptor on
// which it reports readiness.
const UpgradeEnv = "FULCRUM_UPGRADE_FD"

// readyWord is what the new process writes when it serves.
const readyWord = "READY=1\n"

// stopGrace is how long a new process that failed the upgrade gets to
// exit after SIGTERM before it is killed.
const stopGrace = 5 * time.Second

// Passed is one listening socket handed to the new process.
type Passed struct {
	Name string   // its LISTEN_FDNAMES entry: no ':'
	File *os.File // kept open by the caller, which closes it after Upgrade
}

// Upgrade starts path with args, the environment env (without the LISTEN_*,
// WATCHDOG_PID and UpgradeEnv variables it sets or drops) and socks as
// descriptors 3, 4, …, and waits until the new process reports ready (see
// [Notifier.UpgradeReady]) or timeout passes. stdout and stderr are the new
// process's. On success it returns the process, which outlives this one:
// nobody waits for it but its next parent (systemd, once this process has
// exited). If the new process exits, closes the pipe or stays silent, it
// is stopped (SIGTERM, then SIGKILL after 5 s), waited for, and the error
// says how it ended.
func Upgrade(path string, args, env []string, socks []Passed, stdout, stderr *os.File, timeout time.Duration) (*os.Process, error) {
	for _, s := range socks {
		if strings.Contains(s.Name, ":") {
			return nil, fmt.Errorf("upgrade: socket name %q contains ':'", s.Name)
		}
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("upgrade: %w", err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("upgrade: %w", err)
	}
	defer r.Close()
	names := make([]string, len(socks))
	files := []*os.File{null, stdout, stderr}
	for i, s := range socks {
		names[i] = s.Name
		files = append(files, s.File)
	}
	files = append(files, w)
	var cenv []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID", UpgradeEnv:
			// WATCHDOG_PID names this process; without it the pings of the new one count
		default:
			cenv = append(cenv, kv)
		}
	}
	cenv = append(cenv,
		"LISTEN_PID="+strconv.Itoa(os.Getpid()),
		"LISTEN_FDS="+strconv.Itoa(len(socks)),
		"LISTEN_FDNAMES="+strings.Join(names, ":"),
		UpgradeEnv+"="+strconv.Itoa(len(files)-1))
	p, err := os.StartProcess(path, append([]string{path}, args...), &os.ProcAttr{Env: cenv, Files: files})
	w.Close() // the child has its copy: EOF on r means it is gone or gave up
	if err != nil {
		return nil, fmt.Errorf("upgrade: start %s: %w", path, err)
	}
	r.SetReadDeadline(time.Now().Add(timeout))
	got, err := io.ReadAll(io.LimitReader(r, 64))
	if err == nil && bytes.Equal(got, []byte(readyWord)) {
		return p, nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, fmt.Errorf("upgrade: new process %d (%s) not ready within %v; stopped: %s", p.Pid, path, timeout, stop(p, 0))
	}
	// The pipe closed: the process has exited or is about to; one that
	// dropped the descriptor and runs on is stopped after a second.
	return nil, fmt.Errorf("upgrade: new process %d (%s) exited before it was ready: %s", p.Pid, path, stop(p, time.Second))
}

// stop waits up to grace for p to exit on its own, then ends it: SIGTERM,
// and SIGKILL after stopGrace. It returns how p ended.
func stop(p *os.Process, grace time.Duration) string {
	done := make(chan *os.ProcessState, 1)
	go func() { // exits when the process has exited: SIGKILL below guarantees it
		st, _ := p.Wait()
		done <- st
	}()
	var st *os.ProcessState
	select {
	case st = <-done:
	case <-time.After(grace):
		p.Signal(syscall.SIGTERM)
		select {
		case st = <-done:
		case <-time.After(stopGrace):
			p.Kill()
			st = <-done
		}
	}
	if st == nil {
		return "status unknown"
	}
	return st.String()
}

// UpgradeReady returns, in a process started by Upgrade, the function that
// tells the old process that this one serves; call it once every listener
// accepts. It returns nil in any other process. It unsets UpgradeEnv, so
// that children do not see it, and marks the pipe close-on-exec.
func (n *Notifier) UpgradeReady() func() error {
	s := n.getenv(UpgradeEnv)
	if s == "" {
		return nil
	}
	if n == nil || n.Getenv == nil {
		os.Unsetenv(UpgradeEnv)
	}
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return nil
	}
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "upgrade-ready")
	return func() error {
		defer f.Close()
		if _, err := io.WriteString(f, readyWord); err != nil {
			return fmt.Errorf("upgrade: tell the old process: %w", err)
		}
		return nil
	}
}

// MainPID is the MAINPID= message that makes pid the service's main
// process: sent by the old main process once the new one is ready.
func MainPID(pid int) string { return "MAINPID=" + strconv.Itoa(pid) }
