package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// rawDaemon is fulcrum as a child process whose every stderr line is kept,
// JSON or not.
type rawDaemon struct {
	*daemon
	mu  sync.Mutex // protects raw
	raw []string
}

func startRawDaemon(t *testing.T, config string) *rawDaemon {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-config", writeFile(t, "fulcrum.toml", config))
	cmd.Env = append(os.Environ(), "FULCRUM_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &rawDaemon{daemon: &daemon{cmd: cmd, lines: make(chan map[string]any, 1000), exit: make(chan struct{})}}
	go func() { // exits when the child closes stderr
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			d.mu.Lock()
			d.raw = append(d.raw, sc.Text())
			d.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case d.lines <- m:
				default:
				}
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

// notJSON returns the stderr lines so far that are not JSON objects.
func (d *rawDaemon) notJSON() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, l := range d.raw {
		if !json.Valid([]byte(l)) || !strings.HasPrefix(l, "{") {
			out = append(out, l)
		}
	}
	return out
}

// TestAdminCannotStarveDataPath: 300 keep-alive connections to the admin
// listener, with the daemon's descriptor limit 200 above what it uses, must
// leave the data path serving: the admin listener holds at most its cap (64)
// and leaves the rest in the kernel's queue. Its net/http error lines, if
// any, are JSON like every other line.
func TestAdminCannotStarveDataPath(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo).Addr
	d := startRawDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.echo]
listen = ["127.0.0.1:0"]
backends = [{ address = %q }]
`, be))
	admin := d.await(t, "admin listening: /metrics /status /healthz /drain")["addr"].(string)
	addr := d.await(t, "listening")["addr"].(string)
	pid := d.cmd.Process.Pid
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	tight := lim
	tight.Cur = uint64(lowestFreeFD(t, pid) + 200)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &tight, nil); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 300 { // each completes in the kernel's queue if not accepted
		c, err := net.DialTimeout("tcp", admin, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	}
	// Let the admin listener take all it will take: its socket count settles.
	for prev, deadline := -1, time.Now().Add(3*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n, _ := fdKinds(t, pid)
		if n == prev {
			break
		}
		prev = n
	}
	served := 0
	for i := range 10 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		msg := fmt.Sprintf("ping %d", i)
		io.WriteString(c, msg)
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err == nil && string(buf) == msg {
			served++
		}
		c.Close()
	}
	if served != 10 {
		t.Errorf("proxied connections served while 300 admin connections were open: %d of 10; want 10", served)
	}
	if lines := d.notJSON(); len(lines) > 0 {
		t.Errorf("%d plain-text lines in the JSON log, such as %q", len(lines), lines[0])
	}
}
