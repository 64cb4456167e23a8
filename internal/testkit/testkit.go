// Package testkit provides what fulcrum's tests use around a proxy:
// real loopback backend servers, a log sink a test can wait on, and a check
// that no goroutine or descriptor outlives a test. It is for tests only, in
// the manner of net/http/httptest.
//
// Typical use:
//
//	func TestX(t *testing.T) {
//		testkit.CheckLeaks(t) // first, so its cleanup runs last
//		be := testkit.NewServer(t, testkit.Greeter("a"))
//		... point a proxy at be.Addr ...
//	}
//
// Every server, connection and goroutine started here is closed and waited
// for by the test's cleanup.
package testkit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// CheckLeaks fails the test if goroutines or descriptors it started are
// still there once every cleanup has run. Call it first, so that its
// cleanup runs last.
func CheckLeaks(t testing.TB) {
	t.Helper()
	before := OpenFDs(t)
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreCurrent())
		// io.Copy's splice pipes sit in a sync.Pool until two collections
		// pass and their finalizers close them: collect until they are gone.
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			n := OpenFDs(t)
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("descriptors: %d open after the test; %d before\n%s", n, before, fdList())
				return
			}
			time.Sleep(20 * time.Millisecond) // no event tells when a finalizer has run
		}
	})
}

// OpenFDs counts this process's open descriptors (ReadDir's own included).
func OpenFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

func fdList() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		b.WriteString(e.Name() + " → " + l + "\n")
	}
	return b.String()
}

// LogSink collects zerolog JSON lines and lets a test wait for one.
type LogSink struct {
	mu    sync.Mutex // protects lines and wake
	lines []map[string]any
	wake  chan struct{} // closed and replaced on every line
}

// NewLogSink returns an empty sink; use it as a zerolog writer.
func NewLogSink() *LogSink { return &LogSink{wake: make(chan struct{})} }

func (l *LogSink) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(p), &m); err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.lines = append(l.lines, m)
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
	return len(p), nil
}

// Wait returns the first line for which match is true, waiting up to d.
func (l *LogSink) Wait(t testing.TB, d time.Duration, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	seen := 0
	for {
		l.mu.Lock()
		lines, wake := l.lines, l.wake
		l.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if match(lines[seen]) {
				return lines[seen]
			}
		}
		select {
		case <-wake:
		case <-timeout.C:
			t.Fatalf("no log line %s within %v; the last of %d lines: %v", what, d, len(lines), lines[max(0, len(lines)-20):])
		}
	}
}

// All returns the lines seen so far that match.
func (l *LogSink) All(match func(map[string]any) bool) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, m := range l.lines {
		if match(m) {
			out = append(out, m)
		}
	}
	return out
}

// Message matches log lines with the given message.
func Message(msg string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["message"] == msg }
}

// Server is a loopback TCP server running a handler per connection.
type Server struct {
	Addr string // host:port on 127.0.0.1

	ln    *net.TCPListener
	wg    sync.WaitGroup
	mu    sync.Mutex // protects conns
	conns map[*net.TCPConn]bool
}

// NewServer serves handle on 127.0.0.1; each connection is closed when handle
// returns. The test's cleanup closes the server and every connection, and
// waits for the handlers.
func NewServer(t testing.TB, handle func(*net.TCPConn)) *Server {
	t.Helper()
	return NewServerAt(t, "127.0.0.1:0", handle)
}

// NewServerAt is NewServer on a given loopback address.
func NewServerAt(t testing.TB, addr string, handle func(*net.TCPConn)) *Server {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenTCP("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, ln, handle)
}

// Serve is NewServer on a listener the test made itself (in a network
// namespace, say); the test's cleanup closes it.
func Serve(t testing.TB, ln *net.TCPListener, handle func(*net.TCPConn)) *Server {
	s := &Server{ln: ln, Addr: ln.Addr().String(), conns: map[*net.TCPConn]bool{}}
	s.wg.Add(1)
	go func() { // exits when Close closes ln
		defer s.wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go func() { // exits when handle returns
				defer s.wg.Done()
				handle(c)
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Open is the number of connections the server holds now.
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops the server, closes its connections and waits for handlers.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// User hides c's ReadFrom/WriteTo so that a test copies in user space and
// holds no splice pipes: the proxy is then the only splicer.
func User(c *net.TCPConn) io.ReadWriter { return userspace{c} }

type userspace struct{ c *net.TCPConn }

func (u userspace) Read(p []byte) (int, error)  { return u.c.Read(p) }
func (u userspace) Write(p []byte) (int, error) { return u.c.Write(p) }

// Greeter answers with its name and a newline, then waits for the client to
// close.
func Greeter(name string) func(*net.TCPConn) {
	return func(c *net.TCPConn) {
		c.Write([]byte(name + "\n"))
		var b [64]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				return
			}
		}
	}
}

// Echo copies everything back in user space, then half-closes.
func Echo(c *net.TCPConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			c.CloseWrite()
			return
		}
	}
}

// DeadAddr returns a loopback address where nothing listens: a dial is
// refused at once.
func DeadAddr(t testing.TB) string { return FreeAddr(t) }

// FreeAddr returns a loopback address that was free a moment ago, for a
// test that needs an address to give a process it starts: a port below
// 32768 (where no ephemeral port is ever handed out) on an address of
// 127.0.0.0/8 drawn at random (where nothing else of this machine binds),
// so that another socket cannot take it between this call and its use.
func FreeAddr(t testing.TB) string {
	for range 100 {
		a := fmt.Sprintf("127.%d.%d.%d:%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254), 20000+rand.IntN(12000))
		ln, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		ln.Close()
		return a
	}
	t.Fatal("no free loopback address in 100 draws")
	return ""
}

// Postgres is a PostgreSQL cluster of the test's own, on 127.0.0.1.
type Postgres struct {
	Addr string // 127.0.0.1:port
	Dir  string // data directory
	Port int
	bin  string
}

// pgBin finds the directory of PostgreSQL's server programs.
func pgBin() string {
	for _, d := range []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin"} {
		if _, err := os.Stat(d + "/pg_ctl"); err == nil {
			return d
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// StartPostgres initialises and starts a cluster on a free loopback port
// (trust authentication, no fsync), running as the postgres user since
// PostgreSQL refuses to run as root. The test's cleanup stops it and
// removes its files. It skips the test where PostgreSQL is not installed.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	bin := pgBin()
	if bin == "" {
		t.Skip("PostgreSQL is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("starting PostgreSQL as its own user needs root")
	}
	dir, err := os.MkdirTemp("", "fulcrum-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	data := filepath.Join(dir, "data")
	runAs(t, "postgres", bin+"/initdb", "-D", data, "--auth=trust", "--no-sync", "-U", "postgres")
	port := freePort(t)
	p := &Postgres{Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: data, Port: port, bin: bin}
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 200\n", port, dir)
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		t.Fatal(err)
	}
	p.Start(t)
	t.Cleanup(func() { p.Ctl(t, "stop", "-m", "immediate") })
	return p
}

// Start starts the cluster and waits until it accepts connections.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	p.Ctl(t, "start", "-w", "-t", "60", "-l", filepath.Join(filepath.Dir(p.Dir), "log"))
}

// Stop stops the cluster with the given pg_ctl mode (fast, immediate).
func (p *Postgres) Stop(t testing.TB, mode string) {
	t.Helper()
	p.Ctl(t, "stop", "-w", "-m", mode)
}

// Ctl runs pg_ctl on the cluster as the postgres user.
func (p *Postgres) Ctl(t testing.TB, args ...string) {
	t.Helper()
	runAs(t, "postgres", p.bin+"/pg_ctl", append([]string{"-D", p.Dir}, args...)...)
}

// Bin returns the path of one of PostgreSQL's programs (pgbench, psql…).
func (p *Postgres) Bin(name string) string {
	if _, err := os.Stat(filepath.Join(p.bin, name)); err == nil {
		return filepath.Join(p.bin, name)
	}
	return name
}

func runAs(t testing.TB, user, prog string, args ...string) {
	t.Helper()
	out, err := exec.Command("runuser", append([]string{"-u", user, "--", prog}, args...)...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Is server running?") {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Redis is a redis-server of the test's own, on 127.0.0.1.
type Redis struct {
	Addr string
	Port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts redis-server on a free loopback port, with no
// persistence, plus any extra arguments ("--requirepass", "x"). The test's
// cleanup stops it. It skips the test where redis-server is not installed.
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	port := freePort(t)
	r := &Redis{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port,
		args: append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--protected-mode", "no", "--dir", t.TempDir()}, extra...)}
	r.Start(t)
	t.Cleanup(func() { r.Kill() })
	return r
}

// Start starts the server and waits until it answers.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	r.cmd = exec.Command("redis-server", r.args...)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(r.cmd, r.done) // exits with the process
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start: %v", r.Addr, err)
		}
		time.Sleep(20 * time.Millisecond) // a starting server gives no event but its port
	}
}

// Kill stops the server with SIGKILL and waits for it.
func (r *Redis) Kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		<-r.done
		r.cmd = nil
	}
}
