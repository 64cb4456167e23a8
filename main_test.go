package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
)

// TestMain lets the test binary run as fulcrum itself, so that tests can
// start the real daemon as a child process.
func TestMain(m *testing.M) {
	if os.Getenv("FULCRUM_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

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

func TestCheck(t *testing.T) {
	good := writeFile(t, "good.toml", `
[services.pg]
listen = ["127.0.0.1:15432"]
scheduler = "lc"
  [[services.pg.backends]]
  name = "pg-a"
  address = "127.0.0.1:5432"
  weight = 3
  [[services.pg.backends]]
  name = "pg-b"
  address = "127.0.0.1:5433"
  weight = 0
`)
	var out, errOut bytes.Buffer
	if code := run([]string{"-check", "-config", good}, &out, &errOut); code != 0 {
		t.Fatalf("-check good = %d; stderr:\n%s", code, errOut.String())
	}
	for _, want := range []string{"configuration is valid", "service pg", "scheduler lc", "listen 127.0.0.1:15432",
		"pg-a", "127.0.0.1:5432", "3", "pg-b", "0 (drain)", "connect_timeout 3s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}

	bad := writeFile(t, "bad.toml", `
[services.pg]
listen = ["127.0.0.1:15432"]
scheduler = "wlcx"
  [[services.pg.backends]]
  address = "127.0.0.1:5432"
  weight = -3
`)
	out.Reset()
	errOut.Reset()
	if code := run([]string{"-check", "-config", bad}, &out, &errOut); code != 1 {
		t.Fatalf("-check bad = %d; want 1", code)
	}
	for _, want := range []string{bad + ":4: services.pg.scheduler:", bad + ":7: services.pg.backends[0].weight: must not be negative"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("errors lack %q:\n%s", want, errOut.String())
		}
	}
	if code := run([]string{"-check", "-config", filepath.Join(t.TempDir(), "none.toml")}, &out, &errOut); code != 1 {
		t.Errorf("-check on a missing file = %d; want 1", code)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"-version"}, {"version"}} {
		var out bytes.Buffer
		if code := run(args, &out, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "fulcrum ") {
			t.Errorf("%v = %d, %q", args, code, out.String())
		}
		for _, want := range []string{"\ncommit: ", "\ngo: " + runtime.Version(), "\nbuilt: "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v printed %q; want %q in it", args, out.String(), want)
			}
		}
	}
	// What the Makefile stamps with -ldflags -X.
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3-4-gabcdef0", "abcdef0123456789", "2026-12-01T04:00:00Z"
	var out bytes.Buffer
	run([]string{"version"}, &out, io.Discard)
	want := "fulcrum v1.2.3-4-gabcdef0\ncommit: abcdef0123456789\ngo: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\nbuilt: 2026-12-01T04:00:00Z\n"
	if out.String() != want {
		t.Errorf("version = %q; want %q", out.String(), want)
	}
	if code := run([]string{"version", "extra"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("version extra = %d; want 2", code)
	}
}

// TestHelp: -h and --help are a request, not a mistake: usage on stdout, exit 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"status", "-h"}, {"drain", "--help"}, {"healthz", "-h"}, {"demo", "-h"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Errorf("%v = %d; want 0", args, code)
		}
		if !strings.HasPrefix(out.String(), "usage: fulcrum") || errOut.Len() != 0 {
			t.Errorf("%v: stdout %q, stderr %q; want usage on stdout only", args, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-nosuchflag"}, &out, &errOut); code != 2 {
		t.Errorf("-nosuchflag = %d; want 2", code)
	}
	if out.Len() != 0 || !strings.Contains(errOut.String(), "-nosuchflag") || !strings.Contains(errOut.String(), "usage: fulcrum") {
		t.Errorf("-nosuchflag: stdout %q, stderr %q; want the error and usage on stderr", out.String(), errOut.String())
	}
}

// TestCheckQuiet: -check -q is for units' ExecStartPre= and ExecReload=,
// which put everything printed into the journal.
func TestCheckQuiet(t *testing.T) {
	good := writeFile(t, "good.toml", "[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\" }]\n")
	var out, errOut bytes.Buffer
	if code := run([]string{"-check", "-q", "-config", good}, &out, &errOut); code != 0 || out.Len() != 0 || errOut.Len() != 0 {
		t.Errorf("-check -q on a valid file = %d, stdout %q, stderr %q; want 0 and nothing", code, out.String(), errOut.String())
	}
	// A file others may write is valid but unsafe: -check says so, -q does not.
	if err := os.Chmod(good, 0o666); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"-check", "-config", good}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "warning: "+good+" is writable by others") {
		t.Errorf("-check on a 0666 file = %d, stderr %q; want 0 and a warning", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"-check", "-q", "-config", good}, &out, &errOut); code != 0 || out.Len()+errOut.Len() != 0 {
		t.Errorf("-check -q on a 0666 file = %d, stdout %q, stderr %q; want 0 and nothing", code, out.String(), errOut.String())
	}
	bad := writeFile(t, "bad.toml", "[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\", wieght = 2 }]\n")
	if code := run([]string{"-check", "-q", "-config", bad}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `did you mean "weight"`) {
		t.Errorf("-check -q on an invalid file = %d, stderr %q; want 1 and the problem", code, errOut.String())
	}
}

// TestMissingConfig: no file is not an invalid file; say what to do.
func TestMissingConfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fulcrum.toml")
	for _, args := range [][]string{{"-config", missing}, {"-check", "-config", missing}, {"status", "-config", missing}} {
		var errOut bytes.Buffer
		if code := run(args, io.Discard, &errOut); code != 1 {
			t.Errorf("%v = %d; want 1", args, code)
		}
		for _, want := range []string{"no configuration at " + missing, "-config FILE", "fulcrum demo"} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("%v: %q lacks %q", args, errOut.String(), want)
			}
		}
		if strings.Contains(errOut.String(), "invalid") {
			t.Errorf("%v: %q calls a missing file invalid", args, errOut.String())
		}
	}
}

// TestLogFormat: JSON times carry milliseconds; console lines carry no
// colour off a terminal.
func TestLogFormat(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(conf.Log{Level: "info", Format: "json"}, &buf)
	log.Info().Msg("hello")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if ts, _ := m["time"].(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$`).MatchString(ts) {
		t.Errorf("time %q; want RFC 3339 with milliseconds", ts)
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("time %q: %v", ts, err)
	}

	for _, format := range []string{"console", "auto"} {
		buf.Reset()
		log = newLogger(conf.Log{Level: "info", Format: format}, &buf)
		log.Warn().Str("k", "v").Msg("hello")
		line := buf.String()
		if strings.Contains(line, "\x1b[") {
			t.Errorf("format %s off a terminal wrote colour: %q", format, line)
		}
		if format == "console" && !regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} WRN hello k=v\n$`).MatchString(line) {
			t.Errorf("console line %q; want date, time with milliseconds, level, message, fields", line)
		}
		if format == "auto" && json.Unmarshal([]byte(line), &m) != nil {
			t.Errorf("auto off a terminal wrote %q; want JSON", line)
		}
	}

	// The milliseconds are real, not a fixed .000: over lines logged across
	// more than a millisecond, the fraction changes.
	buf.Reset()
	log = newLogger(conf.Log{Level: "info", Format: "console"}, &buf)
	fractions := map[string]bool{}
	for deadline := time.Now().Add(5 * time.Second); len(fractions) < 2 && time.Now().Before(deadline); {
		buf.Reset()
		log.Info().Msg("x")
		fractions[buf.String()[20:23]] = true
		time.Sleep(time.Millisecond) // not for correctness: to let the clock move on
	}
	if len(fractions) < 2 {
		t.Errorf("console timestamps never changed their milliseconds: %v", fractions)
	}
}

// TestLogColour: on a terminal console lines are coloured, unless NO_COLOR is set.
func TestLogColour(t *testing.T) {
	tty := openPTY(t)
	for _, noColor := range []string{"", "1"} {
		t.Setenv("NO_COLOR", noColor)
		log := newLogger(conf.Log{Level: "info", Format: "auto"}, tty.slave)
		log.Info().Msg("hello")
		line := tty.readLine(t)
		if coloured := strings.Contains(line, "\x1b["); coloured != (noColor == "") {
			t.Errorf("NO_COLOR=%q: line %q coloured %v", noColor, line, coloured)
		}
	}
}

type pty struct {
	master, slave *os.File
	r             *bufio.Reader
}

func (p *pty) readLine(t *testing.T) string {
	t.Helper()
	p.master.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := p.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read the terminal: %v", err)
	}
	return line
}

// openPTY opens a pseudo-terminal pair, so that a test can write to a terminal.
func openPTY(t *testing.T) *pty {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return &pty{master: master, slave: slave, r: bufio.NewReader(master)}
}

// syncBuffer is a bytes.Buffer that a test can read while another goroutine writes.
type syncBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemo runs `fulcrum demo` and checks the spread it prints.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() { // exits when ctx is cancelled
		done <- demo(ctx, []string{"-listen", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	var out strings.Builder
	sc := bufio.NewScanner(pr)
	var addr string
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if m := regexp.MustCompile(`try:\s+nc (\S+) (\d+)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = net.JoinHostPort(m[1], m[2])
			break
		}
	}
	for _, want := range []string{"order: alpha alpha alpha bravo alpha bravo charlie alpha bravo charlie",
		"alpha    weight 5   10 connections", "bravo    weight 3    6 connections", "charlie  weight 2    4 connections"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if addr == "" {
		t.Fatalf("demo printed no address:\n%s", out.String())
	}
	// The balancer keeps serving: greet, then echo.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, _ := r.ReadString('\n')
	fmt.Fprintf(c, "hello\n")
	echoed, _ := r.ReadString('\n')
	c.Close()
	if !strings.Contains("alpha bravo charlie", strings.TrimSpace(name)) || echoed != "hello\n" {
		t.Errorf("after the burst: greeting %q, echo %q", name, echoed)
	}
	cancel()
	go io.Copy(io.Discard, pr) // let the demo finish printing
	if code := <-done; code != 0 {
		t.Errorf("demo exited %d", code)
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

func startDaemon(t *testing.T, config string) *daemon {
	t.Helper()
	return startDaemonArgs(t, []string{"-config", writeFile(t, "fulcrum.toml", config)}, nil, nil)
}

// startDaemonArgs runs the test binary as fulcrum with args (or, when args
// start with "-c", a shell with them), extra environment, and extra files
// as descriptors 3, 4, ….
func startDaemonArgs(t *testing.T, args, env []string, files []*os.File) *daemon {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	if args[0] == "-c" {
		cmd = exec.Command("/bin/sh", args...)
	}
	cmd.Env = append(append(os.Environ(), "FULCRUM_TEST_MAIN=1"), env...)
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

// await returns the first log line with the given message.
func (d *daemon) await(t *testing.T, msg string) map[string]any {
	t.Helper()
	return d.awaitMatch(t, fmt.Sprintf("%q", msg), func(m map[string]any) bool { return m["message"] == msg })
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

// pipes counts the splice pipes a process holds (fds above 2: its stdio may be pipes too).
func pipes(t *testing.T, pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if e.Name() == "0" || e.Name() == "1" || e.Name() == "2" {
			continue
		}
		if l, _ := os.Readlink(dir + "/" + e.Name()); strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
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
	addr := d.await(t, "listening")["addr"].(string)
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
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) { // no event to wait on
			if s, p = fdKinds(t, pid); s == wantSockets && p <= maxPipes {
				break
			}
		}
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
	addr := d.await(t, "listening")["addr"].(string)
	base := pipes(t, d.cmd.Process.Pid) // descriptors it may have inherited

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
	for deadline := time.Now().Add(10 * time.Second); seen < 2 && time.Now().Before(deadline); {
		seen = pipes(t, d.cmd.Process.Pid) - base
	}
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
	addr := d.await(t, "listening")["addr"].(string)
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

// TestAdminUnreachable: nothing listening at the admin address says what
// to check, including an [admin] listen changed since the daemon started.
func TestAdminUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	for _, cmd := range []string{"status", "drain", "healthz"} {
		var errOut bytes.Buffer
		if code := run([]string{cmd, "-admin", addr}, io.Discard, &errOut); code != 1 {
			t.Errorf("%s against a closed port = %d; want 1", cmd, code)
		}
		if !strings.Contains(errOut.String(), "connection refused") || !strings.Contains(errOut.String(), "is fulcrum running?") {
			t.Errorf("%s: %q; want the refusal and what to check", cmd, errOut.String())
		}
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
	d := startDaemonArgs(t, []string{"-c", fmt.Sprintf("exec prlimit --nofile=%d %s -config %s", nofile, os.Args[0], path)}, nil, nil)
	adm := d.await(t, "admin listening: /metrics /status /healthz /drain")["addr"].(string) // logged first
	addr := d.await(t, "listening")["addr"].(string)

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
	resp, err := http.Get("http://" + adm + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "fulcrum_connections_max 86\n") {
		t.Error("/metrics lacks fulcrum_connections_max 86")
	}
	var open int // the 64 served last are open; the first 86 may still be ending
	if i := strings.Index(string(metrics), "\nfulcrum_connections "); i < 0 {
		t.Error("/metrics lacks fulcrum_connections")
	} else if fmt.Sscan(string(metrics[i+len("\nfulcrum_connections "):]), &open); open < 64 || open > 86 {
		t.Errorf("fulcrum_connections %d; want 64 to 86", open)
	}
	if strings.Contains(string(metrics), "fulcrum_connection_limit_waits_total 0\n") {
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
	addr := d.await(t, "listening")["addr"].(string)
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
