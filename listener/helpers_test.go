package listener

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"fulcrum/backend"
	"fulcrum/sched"
)

// checkLeaks fails the test if goroutines or descriptors it started are still
// there once every cleanup has run. Call it first, so its cleanup runs last.
func checkLeaks(t *testing.T) {
	t.Helper()
	before := openFDs(t)
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreCurrent())
		// io.Copy's splice pipes sit in a sync.Pool until two collections
		// pass and their finalizers close them: collect until they are gone.
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			n := openFDs(t)
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("descriptors: %d open after the test; %d before\n%s", n, before, fdList(t))
				return
			}
			time.Sleep(20 * time.Millisecond) // no event tells when a finalizer has run
		}
	})
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

func fdList(t *testing.T) string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		b.WriteString(e.Name() + " → " + l + "\n")
	}
	return b.String()
}

// logSink collects JSON log lines and lets a test wait for one.
type logSink struct {
	mu    sync.Mutex // protects lines and wake
	lines []map[string]any
	wake  chan struct{} // closed and replaced on every line
}

func newLogSink() *logSink { return &logSink{wake: make(chan struct{})} }

func (l *logSink) Write(p []byte) (int, error) {
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

// wait returns the first line for which match is true, waiting up to d.
func (l *logSink) wait(t *testing.T, d time.Duration, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	timeout := time.After(d)
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
		case <-timeout:
			t.Fatalf("no log line %s within %v; have %d lines: %v", what, d, len(lines), lines)
		}
	}
}

// all returns the lines seen so far that match.
func (l *logSink) all(match func(map[string]any) bool) []map[string]any {
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

func isAccess(m map[string]any) bool { return m["message"] == "connection" }

// testProxy is a listener.Server on 127.0.0.1:0 serving one service.
type testProxy struct {
	srv  *Server
	ptr  atomic.Pointer[sched.Table]
	addr string
	logs *logSink
	svc  *sched.Service
}

type testBackend struct {
	name   string
	addr   string
	weight int
}

// newProxy starts a proxy for one service over the given backends and stops
// it, closing every session, when the test ends.
func newProxy(t *testing.T, scheduler string, backends []testBackend, tune func(*sched.Service)) *testProxy {
	t.Helper()
	p := &testProxy{logs: newLogSink()}
	targets := make([]sched.Target, len(backends))
	for i, b := range backends {
		targets[i] = sched.Target{B: backend.New("svc", b.name), Addr: netip.MustParseAddrPort(b.addr), Weight: b.weight}
	}
	picker, err := sched.New(scheduler, targets, nil, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.svc = &sched.Service{Name: "svc", Scheduler: scheduler, Targets: targets, Picker: picker,
		ConnectTimeout: 2 * time.Second, Retries: 2, AccessLog: true}
	if tune != nil {
		tune(p.svc)
	}
	key := netip.MustParseAddrPort("127.0.0.1:0")
	p.ptr.Store(sched.NewTable(1, []*sched.Service{p.svc}, map[netip.AddrPort]*sched.Service{key: p.svc}))
	p.srv = New(&p.ptr, zerolog.New(p.logs).Level(zerolog.DebugLevel))
	ch, err := p.srv.Prepare([]netip.AddrPort{key})
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	p.addr = p.srv.Addr(key).String()
	t.Cleanup(func() {
		p.srv.Close()
		for _, tg := range p.svc.Targets { // close whatever is still open
			ctx, cancel := contextDone()
			tg.B.Drain(ctx)
			cancel()
		}
		p.srv.Wait()
	})
	return p
}

func (p *testProxy) dial(t *testing.T) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// server is a loopback TCP server running handle for each connection. The
// test's cleanup closes it and every connection, and waits for handlers.
type server struct {
	ln    *net.TCPListener
	addr  string
	wg    sync.WaitGroup
	mu    sync.Mutex // protects conns
	conns map[*net.TCPConn]bool
}

func newServer(t *testing.T, handle func(*net.TCPConn)) *server {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, addr: ln.Addr().String(), conns: map[*net.TCPConn]bool{}}
	s.wg.Add(1)
	go func() { // exits when the cleanup closes ln
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
	t.Cleanup(s.close)
	return s
}

func (s *server) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// userspace hides a conn's ReadFrom/WriteTo so that test backends copy in
// userspace and hold no splice pipes: the proxy is the only splicer here.
type userspace struct{ c *net.TCPConn }

func (u userspace) Read(p []byte) (int, error)  { return u.c.Read(p) }
func (u userspace) Write(p []byte) (int, error) { return u.c.Write(p) }

// greeter answers with its name, then waits for the client to close.
func greeter(name string) func(*net.TCPConn) {
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

// echo copies everything back, then half-closes.
func echo(c *net.TCPConn) {
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

// deadAddr returns a loopback address where nothing listens: a dial is
// refused at once.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}
