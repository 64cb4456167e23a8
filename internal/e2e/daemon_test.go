package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// TestDaemonIdleDescriptors: in the real daemon an idle proxied connection
// costs exactly its two sockets, and a connection that spliced megabytes
// and then went quiet keeps no pipe: the pipes are pooled and reused, so
// twenty such connections in turn leave only the few pipes of the pool;
// in both copy designs.
func TestDaemonIdleDescriptors(t *testing.T) {
	for _, copy := range []string{"pooled", "parked"} {
		t.Run(copy, func(t *testing.T) { testDaemonIdleDescriptors(t, copy) })
	}
}

func testDaemonIdleDescriptors(t *testing.T, copy string) {
	const idle, bulk = 200, 20
	be := testkit.NewServer(t, testkit.Echo).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
access = false
[defaults]
copy = %q
[services.echo]
listen = ["127.0.0.1:0"]
backends = [{ name = "echo", address = %q }]
`, copy, be))
	addr := d.listenAddr(t)
	pid := d.cmd.Process.Pid
	sockets0, pipes0 := fdKinds(t, pid)

	conns := make([]net.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	ping := make([]byte, 64)
	out, echo := make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range idle {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(ping); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, echo[:len(ping)]); err != nil {
			t.Fatalf("connection %d: echo: %v", i, err)
		}
	}
	// Descriptors settle once the daemon has accepted and dialled for every
	// connection, which the echoes prove; count until they do.
	settled := func(wantSockets int, maxPipes int) (int, int) {
		var s, p int
		testkit.Until(10*time.Second, func() error { // no event to wait on; the caller says what it sees
			if s, p = fdKinds(t, pid); s != wantSockets || p > maxPipes {
				return errors.New("not settled")
			}
			return nil
		})
		return s, p
	}
	s, p := settled(sockets0+2*idle, pipes0)
	if s-sockets0 != 2*idle || p != pipes0 {
		t.Errorf("%d idle connections: %d more sockets, %d more pipe fds; want %d and 0", idle, s-sockets0, p-pipes0, 2*idle)
	}

	for i, c := range conns[:bulk] { // in turn: splice 1 MiB each way, then stay open and quiet
		c.SetDeadline(time.Now().Add(10 * time.Second))
		werr := make(chan error, 1)
		go func() { _, err := c.Write(out); werr <- err }() // exits when written
		if _, err := io.ReadFull(c, echo); err != nil {
			t.Fatalf("bulk %d: %v", i, err)
		}
		if err := <-werr; err != nil {
			t.Fatalf("bulk %d: %v", i, err)
		}
	}
	// Each bulk connection needed up to 2 pipes (4 fds) while it moved data.
	// Pipes kept by quiet connections would add up to 4 fds each.
	const poolFDs = 4 * 2
	s, p = settled(sockets0+2*idle, pipes0+poolFDs)
	if s-sockets0 != 2*idle || p-pipes0 > poolFDs {
		t.Errorf("after %d connections spliced and went quiet: %d more sockets, %d more pipe fds; want %d and at most %d (the pool)",
			bulk, s-sockets0, p-pipes0, 2*idle, poolFDs)
	}
	if p == pipes0 {
		t.Errorf("no pipe appeared: 1 MiB echoes did not splice")
	}
}

// TestDaemonSplices runs the real daemon: it serves a config, moves bytes
// with splice(2) (seen as the pipes it holds while data moves — nothing
// else in fulcrum makes pipes), and exits 0 on SIGTERM.
//
// It runs on a plain address, and on one routed by name (docs/routing.md),
// where the client's ClientHello is peeked before the route is chosen.
func TestDaemonSplices(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testDaemonSplices(t, "", nil) })
	t.Run("routed", func(t *testing.T) {
		testDaemonSplices(t, `sni = ["sink.example.com"]`, clientHello(t, "sink.example.com"))
	})
}

func testDaemonSplices(t *testing.T, route string, first []byte) {
	be := testkit.NewServer(t, func(c *net.TCPConn) { // a sink
		io.Copy(io.Discard, testkit.User(c))
		c.Write([]byte("done"))
	}).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.sink]
listen = ["127.0.0.1:0"]
%s
backends = [{ name = "sink", address = %q }]
`, route, be))
	addr := d.listenAddr(t)
	_, base := fdKinds(t, d.cmd.Process.Pid) // descriptors it may have inherited

	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	wrote := make(chan error, 1)
	go func() { // writes until told to stop (bounded: 1 GiB)
		buf := make([]byte, 256<<10)
		for range 4096 {
			select {
			case <-stop:
				wrote <- nil
				return
			default:
			}
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	seen := 0
	testkit.Until(10*time.Second, func() error { // the daemon's descriptors give no event; seen says it below
		_, p := fdKinds(t, d.cmd.Process.Pid)
		if seen = p - base; seen < 2 {
			return errors.New("no splice pipe")
		}
		return nil
	})
	close(stop)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if seen < 2 {
		t.Errorf("no splice pipe seen in the daemon while data moved: the copy is not splicing")
	}
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "done" {
		t.Fatalf("answer = %q, %v", b, err)
	}
	line := d.await(t, "connection")
	if line["end"] != "client close" {
		t.Errorf("access log end = %v", line["end"])
	}
	if sni, _ := line["sni"].(string); first != nil && sni != "sink.example.com" {
		t.Errorf("access log sni = %q; want sink.example.com", sni)
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	d.expectExit(t, 10*time.Second)
}

// TestDaemonSurvivesEMFILE: when the daemon's descriptor table is full its
// accept loop backs off and logs, and serves again once descriptors free up.
func TestDaemonSurvivesEMFILE(t *testing.T) {
	be := testkit.NewServer(t, func(c *net.TCPConn) { c.Write([]byte("hi\n")) }).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.s]
listen = ["127.0.0.1:0"]
backends = [{ address = %q }]
`, be))
	addr := d.listenAddr(t)
	pid := d.cmd.Process.Pid
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	tight := lim
	tight.Cur = uint64(lowestFreeFD(t, pid)) // full: the next accept fails
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &tight, nil); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second) // completes in the kernel backlog
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line := d.await(t, "accept failed"); !strings.Contains(fmt.Sprint(line["error"]), "too many open files") {
		t.Errorf("accept error = %v; want EMFILE", line["error"])
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "hi\n" {
		t.Fatalf("after the limit was lifted: %q, %v; want the greeting", got, err)
	}
}

// TestDaemonConnectionLimit: with its descriptor table nearly full, the
// daemon stops accepting at the limit it derived from RLIMIT_NOFILE instead
// of failing dials with EMFILE (which used to mark a healthy backend down
// and close clients with "no backend"): every client is served, the later
// ones as soon as earlier ones end.
func TestDaemonConnectionLimit(t *testing.T) {
	be := testkit.NewServer(t, func(c *net.TCPConn) { // greets, then holds the connection until the client ends it
		c.Write([]byte("hi\n"))
		io.Copy(io.Discard, c)
	}).Addr
	path := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.s]
listen = ["127.0.0.1:0"]
backends = [{ address = %q }]
`, be))
	const nofile = 300 // a limit of (300 - 128) / 2 = 86 connections
	d := startDaemonArgs(t, []string{"-c", fmt.Sprintf("exec prlimit --nofile=%d %s -config %s", nofile, bin, path)}, nil, nil)
	adm := d.adminAddr(t) // logged first
	addr := d.listenAddr(t)

	const clients = 150 // 300 descriptors: more than the table holds
	conns := make([]net.Conn, 0, clients)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	greeted := make(chan int, clients)
	for i := range clients {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second) // completes in the kernel backlog
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		conns = append(conns, c)
		go func() { // exits when the greeting comes or the connection is closed
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			if got, err := bufio.NewReader(c).ReadString('\n'); err == nil && got == "hi\n" {
				greeted <- i
			} else {
				greeted <- -1
			}
		}()
	}
	line := d.awaitMatch(t, "the connection limit", func(m map[string]any) bool {
		return strings.HasPrefix(fmt.Sprint(m["message"]), "connection limit reached")
	}, "backend down")
	max := int(line["max_conns"].(float64))
	if max != 86 {
		t.Errorf("max_conns = %d; want 86 for a table of %d", max, nofile)
	}
	served := map[int]bool{}
	for len(served) < max {
		i := <-greeted
		if i < 0 {
			t.Fatalf("a client was closed without its greeting after %d were served", len(served))
		}
		served[i] = true
	}
	// End the served ones: the waiting ones are accepted and served.
	for i := range served {
		conns[i].Close()
	}
	for len(served) < clients {
		i := <-greeted
		if i < 0 {
			t.Fatalf("a waiting client was closed without its greeting (%d served)", len(served))
		}
		served[i] = true
	}
	_, metrics := get(t, adm, "/metrics")
	if !strings.Contains(metrics, "fulcrum_connections_max 86\n") {
		t.Error("/metrics lacks fulcrum_connections_max 86")
	}
	var open int // the 64 served last are open; the first 86 may still be ending
	if i := strings.Index(metrics, "\nfulcrum_connections "); i < 0 {
		t.Error("/metrics lacks fulcrum_connections")
	} else if fmt.Sscan(metrics[i+len("\nfulcrum_connections "):], &open); open < 64 || open > 86 {
		t.Errorf("fulcrum_connections %d; want 64 to 86", open)
	}
	if strings.Contains(metrics, "fulcrum_connection_limit_waits_total 0\n") {
		t.Error("/metrics counts no wait at the limit")
	}
	for _, c := range conns {
		c.Close()
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	for m := range d.lines { // every line until it exits: no backend was ever marked down
		if m["message"] == "backend down" || m["end"] == "no backend" {
			t.Errorf("logged %v", m)
		}
	}
}

// TestDaemonSIGQUITStopsGracefully: nginx users send SIGQUIT for a graceful
// stop, so fulcrum treats it as SIGTERM: it stops accepting, a connection in
// flight still completes, and the process exits 0 (Go's default would dump
// every goroutine and exit 2, dropping the connection).
func TestDaemonSIGQUITStopsGracefully(t *testing.T) {
	be := testkit.NewServer(t, func(c *net.TCPConn) { // echoes until EOF
		io.Copy(c, testkit.User(c))
		c.CloseWrite()
	}).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.echo]
listen = ["127.0.0.1:0"]
backends = [{ name = "echo", address = %q }]
`, be))
	addr := d.listenAddr(t)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGQUIT)
	d.await(t, "stopped accepting; draining connections")
	if _, err := c.Write([]byte("pong")); err != nil {
		t.Fatalf("write after SIGQUIT: %v", err)
	}
	c.(*net.TCPConn).CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "pong" {
		t.Fatalf("echo after SIGQUIT = %q, %v; want \"pong\"", b, err)
	}
	d.expectExit(t, 10*time.Second)
}
