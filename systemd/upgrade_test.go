package systemd

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUpgrade starts real processes (sh scripts standing in for the new
// binary) and checks each way the handoff can end: ready, exited, silent
// past the bound, pipe closed without READY. The script sees the
// variables the adoption code reads.
func TestUpgrade(t *testing.T) {
	t.Parallel()
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("no /bin/sh")
	}
	f, err := os.CreateTemp(t.TempDir(), "sock") // any descriptor will do as the passed "socket"
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tests := []struct {
		name, script string
		timeout      time.Duration
		wantErr      string // "" for success
	}{
		{"ready",
			`[ "$LISTEN_FDS" = 1 ] && [ "$LISTEN_FDNAMES" = a.b ] && [ "$LISTEN_PID" = "$PPID" ] && [ -z "$WATCHDOG_PID" ] || exit 9
			 eval "echo READY=1 >&$FULCRUM_UPGRADE_FD"; eval "exec $FULCRUM_UPGRADE_FD>&-"; sleep 5`,
			10 * time.Second, ""},
		{"exits", `exit 3`, 10 * time.Second, "exited before it was ready: exit status 3"},
		{"silent", `exec sleep 30`, 300 * time.Millisecond, "not ready within 300ms; stopped: signal: terminated"},
		{"closes the pipe", `eval "exec $FULCRUM_UPGRADE_FD>&-"; exec sleep 30`, 10 * time.Second, "exited before it was ready: signal: terminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := append(os.Environ(), "WATCHDOG_PID=1", "LISTEN_FDS=7")
			p, err := Upgrade(sh, []string{"-c", tt.script}, env, []Passed{{Name: "a.b", File: f}}, os.Stderr, os.Stderr, tt.timeout)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Upgrade = %v; want ready", err)
				}
				p.Kill()
				p.Wait()
				return
			}
			if err == nil {
				p.Kill()
				p.Wait()
				t.Fatalf("Upgrade succeeded; want %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Upgrade = %v; want %q", err, tt.wantErr)
			}
		})
	}
}

// TestUpgradeReady: in the new process, the function writes READY=1 on the
// descriptor named by FULCRUM_UPGRADE_FD; elsewhere it is nil.
func TestUpgradeReady(t *testing.T) {
	t.Parallel()
	if (&Notifier{Getenv: env(map[string]string{})}).UpgradeReady() != nil {
		t.Error("UpgradeReady() without the variable is not nil")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd, err := syscall.Dup(int(w.Fd())) // UpgradeReady's to close
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	ready := (&Notifier{Getenv: env(map[string]string{UpgradeEnv: strconv.Itoa(fd)})}).UpgradeReady()
	if ready == nil {
		t.Fatal("UpgradeReady() = nil")
	}
	if err := ready(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, _ := r.Read(buf)
	if got := string(buf[:n]); got != "READY=1\n" {
		t.Errorf("the old process read %q; want READY=1", got)
	}
}
