package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// TestAdminCannotStarveDataPath: 300 keep-alive connections to the admin
// listener, with the daemon's descriptor limit 200 above what it uses, must
// leave the data path serving: the admin listener holds at most its cap (64)
// and leaves the rest in the kernel's queue. Its net/http error lines, if
// any, are JSON like every other line.
func TestAdminCannotStarveDataPath(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.echo]
listen = ["127.0.0.1:0"]
backends = [{ address = %q }]
`, be))
	admin := d.adminAddr(t)
	addr := d.listenAddr(t)
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
	// Let the admin listener take all it will take: its socket count settles
	// (unchanged for 50 ms; if it never does, the pings below say so).
	prev, since := -1, time.Now()
	testkit.Until(3*time.Second, func() error {
		if n, _ := fdKinds(t, pid); n != prev {
			prev, since = n, time.Now()
		}
		if time.Since(since) < 50*time.Millisecond {
			return errors.New("the socket count is still moving")
		}
		return nil
	})
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
