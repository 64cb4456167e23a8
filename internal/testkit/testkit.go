// Package testkit provides what fulcrum's tests use around a proxy:
// real loopback backend servers, real database servers (PostgreSQL with
// replicas, MariaDB, Redis; db.go), certificates, a log sink a test can
// wait on, and a check that no goroutine or descriptor outlives a test. It is for tests only, in
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
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
		if err := Until(10*time.Second, func() error { // no event tells when a finalizer has run
			runtime.GC()
			if n := OpenFDs(t); n > before {
				return fmt.Errorf("descriptors: %d open after the test; %d before", n, before)
			}
			return nil
		}); err != nil {
			t.Errorf("%v\n%s", err, fdList())
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

// Greeting connects to addr and returns the first line it reads (a
// Greeter's name), without its newline.
func Greeting(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(s), err
}

// SyncBuffer is a bytes.Buffer that a test can read while another goroutine
// writes to it.
type SyncBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Holder is a backend handler (its Handle method) that greets with "in",
// then holds each connection until the client closes it, and records the
// most it held at once.
type Holder struct {
	Open, Peak, Served atomic.Int64
}

// Handle serves one connection.
func (h *Holder) Handle(c *net.TCPConn) {
	n := h.Open.Add(1)
	for {
		p := h.Peak.Load()
		if n <= p || h.Peak.CompareAndSwap(p, n) {
			break
		}
	}
	h.Served.Add(1)
	c.Write([]byte("in\n"))
	io.Copy(io.Discard, c)
	h.Open.Add(-1)
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
