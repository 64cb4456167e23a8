package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestSystemdNotify plays systemd and checks the exact sequence of
// sd_notify messages across start, a valid and an invalid reload, watchdog
// pings and stop.
func TestSystemdNotify(t *testing.T) {
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	ns := newNotifySocket(t)
	config := func(w int) string {
		return fmt.Sprintf("[log]\nformat = \"json\"\n[reload]\ndebounce = \"50ms\"\n[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ name = \"a\", address = %q, weight = %d }]\n", be, w)
	}
	d := startDaemon(t, config(1), "NOTIFY_SOCKET="+ns.path, "WATCHDOG_USEC=1000000")
	path := d.cmd.Args[2]
	pings := 0

	want := func(prefix, contains string) string {
		t.Helper()
		m := ns.next(t, &pings)
		if !strings.HasPrefix(m, prefix) || !strings.Contains(m, contains) {
			t.Fatalf("sd_notify message %q; want %q…%q", m, prefix, contains)
		}
		return m
	}
	want("READY=1\nSTATUS=generation 1; 1 services; backends 1/1 up; 0 connections", "")

	// Renamed over, not written in place: a truncation seen on its own
	// would be one more (refused) reload in the exact sequence this checks.
	replaceFile(t, path, []byte(config(2)))
	want("RELOADING=1\nMONOTONIC_USEC=", "")
	want("READY=1\nSTATUS=generation 2;", "")

	replaceFile(t, path, []byte(config(3)+"\nbogus = 1\n"))
	want("RELOADING=1\nMONOTONIC_USEC=", "")
	want("READY=1\nSTATUS=generation 2;", "last reload failed: "+path+":9: services.s.bogus: unknown key")

	// Watchdog pings at half of WATCHDOG_USEC keep coming while idle.
	start, before := time.Now(), pings
	for pings < before+3 {
		select {
		case m := <-ns.msgs:
			if strings.HasPrefix(m, "WATCHDOG=1") {
				pings++
			} else {
				t.Fatalf("unexpected %q", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d watchdog pings", pings-before)
		}
	}
	if el := time.Since(start); el < time.Second || el > 5*time.Second {
		t.Errorf("3 watchdog pings took %v; want about 1.5s (every 500ms)", el)
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	want("STOPPING=1", "")
	d.expectExit(t, 10*time.Second)
}

// TestSocketActivation: under the real systemd-socket-activate, fulcrum
// adopts the socket for the service listening on its address, and a socket
// named after a service (FileDescriptorName=) serves that service.
func TestSocketActivation(t *testing.T) {
	tool := needProgram(t, "systemd-socket-activate")
	a := testkit.NewServer(t, testkit.Greeter("a")).Addr
	byAddr, byName := testkit.FreeAddr(t), testkit.FreeAddr(t)
	config := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
[services.s]
listen = [%q]
backends = [{ address = %q }]
[services.named]
listen = ["127.0.0.1:0"]
backends = [{ address = %q }]
`, byAddr, a, a))
	cmd := exec.Command(tool, "-l", byAddr, "-l", byName, "--fdname=s:named",
		bin, "-config", config)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // protects logs
	var logs strings.Builder
	listening := make(chan struct{}, 2)
	done := make(chan struct{})
	go func() { // exits when the process ends
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Listening on") {
				listening <- struct{}{}
			}
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-done; cmd.Wait() })
	for range 2 {
		select {
		case <-listening:
		case <-time.After(10 * time.Second):
			t.Fatal("systemd-socket-activate is not listening")
		}
	}

	// The tool accepts the first connection's SYN in the kernel and starts
	// fulcrum; the greeting proves fulcrum adopted the socket (had it bound
	// the address itself, the tool's socket would have made it fail).
	for _, addr := range []string{byAddr, byName} {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		c.SetDeadline(time.Now().Add(15 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || line != "a\n" {
			mu.Lock()
			out := logs.String()
			mu.Unlock()
			t.Fatalf("through the socket on %s: %q, %v\n%s", addr, line, err, out)
		}
	}
}

// TestRestartKeepsBacklog holds the listening socket as systemd does and
// passes it (LISTEN_FDS) to one fulcrum after another: a connection made
// while no fulcrum runs waits in the backlog and is served by the next.
func TestRestartKeepsBacklog(t *testing.T) {
	a := testkit.NewServer(t, testkit.Greeter("a")).Addr
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	config := writeFile(t, "fulcrum.toml", fmt.Sprintf("[log]\nformat = \"json\"\n[services.s]\nlisten = [%q]\nbackends = [{ address = %q }]\n", ln.Addr(), a))
	run := func() *daemon {
		// LISTEN_PID must be fulcrum's own pid: a shell sets it to its pid
		// and then execs fulcrum, which keeps it.
		return startDaemonArgs(t, []string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin, "-config", config},
			[]string{"LISTEN_FDS=1", "LISTEN_FDNAMES=s"}, []*os.File{f})
	}
	greet := func(c net.Conn) string {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}

	first := run()
	first.await(t, "listening")
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil || greet(c1) != "a\n" {
		t.Fatalf("first fulcrum: %v", err)
	}
	c1.Close()
	first.cmd.Process.Signal(syscall.SIGTERM)
	<-first.exit

	waiting, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second) // nobody accepts: the kernel queues it
	if err != nil {
		t.Fatalf("dial while fulcrum is down: %v", err)
	}
	defer waiting.Close()
	second := run()
	second.await(t, "listening")
	if got := greet(waiting); got != "a\n" {
		t.Errorf("the connection made between the two processes got %q; want it served", got)
	}
}

// TestGracefulStop: SIGTERM with 100 open connections and drain_timeout 3s.
// Connections that end within 3s complete intact; the rest are closed at 3s
// (± 0.5s); the exit status is 0.
func TestGracefulStop(t *testing.T) {
	const n, drain = 100, 3 * time.Second
	be := testkit.NewServer(t, testkit.Echo).Addr
	d := startDaemon(t, fmt.Sprintf("[log]\nformat = \"json\"\n[services.s]\nlisten = [\"127.0.0.1:0\"]\ndrain_timeout = %q\nbackends = [{ address = %q }]\n", drain, be))
	addr := d.listenAddr(t)
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "hello %d\n", i)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != fmt.Sprintf("hello %d\n", i) {
			t.Fatalf("conn %d before stop: %q, %v", i, line, err)
		}
		conns[i] = c
	}
	stop := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.await(t, "stopped accepting; draining connections")
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("a new connection was accepted after SIGTERM")
	}

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() { // exits when its connection ends
			defer wg.Done()
			r := bufio.NewReader(c)
			if i%2 == 0 { // finishes within the drain: one more exchange, then a clean close
				time.Sleep(time.Duration(i) * 10 * time.Millisecond) // spread over 1s: the traffic pattern
				fmt.Fprintf(c, "bye %d\n", i)
				if line, err := r.ReadString('\n'); err != nil || line != fmt.Sprintf("bye %d\n", i) {
					errs <- fmt.Errorf("conn %d during the drain: %q, %v", i, line, err)
				}
				c.(*net.TCPConn).CloseWrite()
				if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
					errs <- fmt.Errorf("conn %d end: %q, %v", i, rest, err)
				}
				return
			}
			io.ReadAll(r) // stays open until fulcrum closes it
			// Not before the deadline; after it by as long as a loaded
			// machine takes to run the closes and deliver the FINs.
			if el := time.Since(stop); el < drain-drain/6 || el > drain+5*time.Second {
				errs <- fmt.Errorf("conn %d closed after %v; want %v, -0.5s to +5s", i, el, drain)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d.expectExit(t, 10*time.Second)
}

// TestSecondSignal: a second SIGTERM during the drain exits at once.
func TestSecondSignal(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo).Addr
	d := startDaemon(t, fmt.Sprintf("[log]\nformat = \"json\"\n[services.s]\nlisten = [\"127.0.0.1:0\"]\ndrain_timeout = \"1h\"\nbackends = [{ address = %q }]\n", be))
	addr := d.listenAddr(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hi\n")
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "hi\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.await(t, "stopped accepting; draining connections")
	start := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exit:
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("exited %v after the second signal", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a second SIGTERM did not end the drain")
	}
	// Its message is a log line in the chosen format, like every other.
	if m := d.await(t, "second signal, exiting now"); m["level"] != "warn" {
		t.Errorf("second signal logged %v; want at warn", m)
	}
	if ee, ok := d.err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("exit after a second signal: %v; want status 1", d.err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.other) > 0 {
		t.Errorf("lines outside the JSON format: %q", d.other)
	}
}
