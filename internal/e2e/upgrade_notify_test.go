package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// notifyMsg is one sd_notify datagram and the pid that sent it, as systemd
// sees it (SCM_CREDENTIALS).
type notifyMsg struct {
	pid int
	msg string
}

// credNotifySocket plays systemd with NotifyAccess=main in mind: a unixgram
// socket that records each message's sender.
func credNotifySocket(t *testing.T) (path string, msgs <-chan notifyMsg) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path = filepath.Join(dir, "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan notifyMsg, 1000)
	done := make(chan struct{})
	go func() { // exits when the cleanup closes c
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := notifyMsg{msg: string(buf[:n])}
			if scms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(scms) > 0 {
				if cred, err := unix.ParseUnixCredentials(&scms[0]); err == nil {
					m.pid = int(cred.Pid)
				}
			}
			ch <- m
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return path, ch
}

// nextNotify returns the next message that is not a watchdog ping.
func nextNotify(t *testing.T, msgs <-chan notifyMsg, what string) notifyMsg {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case m := <-msgs:
			if !strings.HasPrefix(m.msg, "WATCHDOG=1") {
				return m
			}
		case <-timeout:
			t.Fatalf("no sd_notify message within 15s; waiting for %s", what)
		}
	}
}

// TestReadyAfterUpgrade: after `fulcrum upgrade`, each reload of the new
// process (SIGHUP, or the file saved) sends RELOADING=1 with MONOTONIC_USEC
// and then READY=1, from the new main pid, as systemd's Type=notify-reload
// protocol wants (sd_notify(3)); before, the new process sent RELOADING=1
// and never READY=1, and systemd would have held the unit in "reloading"
// until its timeout on every reload (issue 30).
func TestReadyAfterUpgrade(t *testing.T) {
	becomeSubreaper(t)
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	sock, msgs := credNotifySocket(t)
	text := fmt.Sprintf("[log]\nformat = \"json\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = %q }]\n", be)
	config := writeFile(t, "fulcrum.toml", text)
	d := startDaemonArgs(t, []string{"-config", config}, []string{"NOTIFY_SOCKET=" + sock}, nil)
	t.Cleanup(func() { // before startDaemonArgs's: its stderr reader ends only when every daemon is gone
		for _, pid := range daemonPIDs(t, config) {
			if pid != d.cmd.Process.Pid {
				syscall.Kill(pid, syscall.SIGKILL)
				reap(t, pid, 10*time.Second)
			}
		}
	})
	adm := d.adminAddr(t)
	oldPID := d.cmd.Process.Pid
	if m := nextNotify(t, msgs, "READY=1"); !strings.HasPrefix(m.msg, "READY=1") || m.pid != oldPID {
		t.Fatalf("first message %q from pid %d; want READY=1 from %d", m.msg, m.pid, oldPID)
	}

	var out, errb bytes.Buffer
	if code := cli([]string{"upgrade", "-admin", adm}, &out, &errb); code != 0 {
		t.Fatalf("fulcrum upgrade = %d; stdout %q, stderr %q", code, out.String(), errb.String())
	}
	var newPID, was int
	if _, err := fmt.Sscanf(out.String(), "upgraded: pid %d serves; pid %d drains", &newPID, &was); err != nil || was != oldPID {
		t.Fatalf("fulcrum upgrade printed %q (%v)", out.String(), err)
	}
	if m := nextNotify(t, msgs, "MAINPID="); !strings.HasPrefix(m.msg, fmt.Sprintf("MAINPID=%d\n", newPID)) || m.pid != oldPID {
		t.Fatalf("after the upgrade: %q from pid %d; want MAINPID=%d from %d", m.msg, m.pid, newPID, oldPID)
	}

	// Each reload, three by SIGHUP and one by saving the file: RELOADING=1
	// then READY=1, both from the main pid, and nothing in between.
	for i := range 4 {
		trigger := "SIGHUP"
		if i < 3 {
			syscall.Kill(newPID, syscall.SIGHUP)
		} else {
			trigger = "file"
			replaceFile(t, config, []byte(strings.Replace(text, "[services.s]\n", "[services.s]\nretries = 1\n", 1)))
		}
		m := nextNotify(t, msgs, "RELOADING=1")
		if !strings.HasPrefix(m.msg, "RELOADING=1\n") || !strings.Contains(m.msg, "MONOTONIC_USEC=") || m.pid != newPID {
			t.Fatalf("reload %d (%s): %q from pid %d; want RELOADING=1 with MONOTONIC_USEC from %d", i+1, trigger, m.msg, m.pid, newPID)
		}
		m = nextNotify(t, msgs, "READY=1")
		if !strings.HasPrefix(m.msg, "READY=1") || m.pid != newPID {
			t.Fatalf("reload %d (%s): after RELOADING=1, %q from pid %d; want READY=1 from %d", i+1, trigger, m.msg, m.pid, newPID)
		}
	}
	if name, err := testkit.Greeting(d.listenAddr(t)); err != nil || name != "a" {
		t.Errorf("after the reloads: %q, %v", name, err)
	}
	syscall.Kill(newPID, syscall.SIGTERM)
	reap(t, newPID, 20*time.Second)
}
