package listener

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

func contextDone() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}

// stream writes n deterministic bytes (seeded) to w.
func stream(w io.Writer, seed uint64, n int) error {
	r := rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := min(n, len(buf))
		for i := 0; i < k; i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < k; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func streamSum(seed uint64, n int) [32]byte {
	h := sha256.New()
	stream(h, seed, n)
	return [32]byte(h.Sum(nil))
}

// TestBulkBothWays moves 16 MiB each way at once and compares checksums.
func TestBulkBothWays(t *testing.T) { testBulkBothWays(t) }

// testBulkBothWays is TestBulkBothWays with opts applied to every Server it starts (TestLoops).
func testBulkBothWays(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	const size = 16 << 20
	got := make(chan [32]byte, 1)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		done := make(chan error, 1)
		go func() { done <- stream(testkit.User(c), 2, size) }() // exits when the stream is written
		h := sha256.New()
		io.Copy(h, testkit.User(c))
		got <- [32]byte(h.Sum(nil))
		if <-done == nil {
			c.CloseWrite()
		}
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, opts...)
	c := p.dial(t)
	werr := make(chan error, 1)
	go func() { // exits when the upload is written
		err := stream(testkit.User(c), 1, size)
		c.CloseWrite()
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, testkit.User(c))
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v; want %d", n, err, size)
	}
	if err := <-werr; err != nil {
		t.Fatalf("upload: %v", err)
	}
	if [32]byte(h.Sum(nil)) != streamSum(2, size) {
		t.Errorf("download checksum differs")
	}
	if <-got != streamSum(1, size) {
		t.Errorf("upload checksum differs at the backend")
	}
	line := p.logs.Wait(t, 5*time.Second, "access", isAccess)
	if line["bytes_in"] != float64(size) || line["bytes_out"] != float64(size) {
		t.Errorf("access log bytes = %v/%v; want %d each", line["bytes_in"], line["bytes_out"], size)
	}
	st := p.svc.Targets[0].B.Stats()
	if st.BytesIn != size || st.BytesOut != size || st.Total != 1 || st.Active != 0 {
		t.Errorf("backend stats = %+v", st)
	}
}

// TestHalfClose: the client sends and shuts its write side; the backend
// answers only after EOF, and the client still gets the whole answer.
func TestHalfClose(t *testing.T) { testHalfClose(t) }

// testHalfClose is TestHalfClose with opts applied to every Server it starts (TestLoops).
func testHalfClose(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	const answer = 1 << 20
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		req, err := io.ReadAll(testkit.User(c))
		if err != nil {
			return
		}
		fmt.Fprintf(c, "got %q\n", req)
		stream(testkit.User(c), 7, answer)
		c.CloseWrite()
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, opts...)
	c := p.dial(t)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || head != "got \"hello\"\n" {
		t.Fatalf("answer head = %q, %v", head, err)
	}
	h := sha256.New()
	if n, err := io.Copy(h, r); err != nil || n != answer {
		t.Fatalf("answer body = %d bytes, %v; want %d", n, err, answer)
	}
	if [32]byte(h.Sum(nil)) != streamSum(7, answer) {
		t.Errorf("answer checksum differs")
	}
	line := p.logs.Wait(t, 5*time.Second, "access", isAccess)
	if line["end"] != endClient {
		t.Errorf("end = %v; want %q", line["end"], endClient)
	}
}

// TestBackendClosesFirst: the backend's FIN reaches the client, and the
// client's later data still reaches the backend.
func TestBackendClosesFirst(t *testing.T) { testBackendClosesFirst(t) }

// testBackendClosesFirst is TestBackendClosesFirst with opts applied to every Server it starts (TestLoops).
func testBackendClosesFirst(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	got := make(chan string, 1)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		c.Write([]byte("bye\n"))
		c.CloseWrite()
		b, _ := io.ReadAll(testkit.User(c))
		got <- string(b)
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, opts...)
	c := p.dial(t)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(testkit.User(c))
	if err != nil || string(b) != "bye\n" {
		t.Fatalf("read = %q, %v", b, err)
	}
	c.Write([]byte("late words"))
	c.CloseWrite()
	if s := <-got; s != "late words" {
		t.Errorf("backend got %q; want %q", s, "late words")
	}
	if line := p.logs.Wait(t, 5*time.Second, "access", isAccess); line["end"] != endBackend {
		t.Errorf("end = %v; want %q", line["end"], endBackend)
	}
}

// TestResetMidStream: a backend reset ends the client's connection promptly.
func TestResetMidStream(t *testing.T) { testResetMidStream(t) }

// testResetMidStream is TestResetMidStream with opts applied to every Server it starts (TestLoops).
func testResetMidStream(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		c.Write([]byte("partial"))
		var b [1]byte
		c.Read(b[:]) // wait for the client's go-ahead
		c.SetLinger(0)
		c.Close() // RST
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, opts...)
	c := p.dial(t)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [7]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("x"))
	if _, err := io.ReadAll(testkit.User(c)); errors.Is(err, unix.ETIMEDOUT) || isTimeout(err) {
		t.Fatalf("client was not closed after the backend reset: %v", err)
	}
	line := p.logs.Wait(t, 5*time.Second, "access", isAccess)
	if line["end"] != endReset {
		t.Errorf("end = %v; want %q", line["end"], endReset)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestRetrySkipsDeadBackend: a refused backend is skipped by the retry and
// the connection is served by another; it is never tried twice.
func TestRetrySkipsDeadBackend(t *testing.T) {
	testkit.CheckLeaks(t)
	live := testkit.NewServer(t, testkit.Greeter("live"))
	dead := testkit.DeadAddr(t)
	p := newProxy(t, "rr", []testBackend{{"dead", dead, 1}, {"live", live.Addr, 1}}, func(s tuned) { s.Retries = 1 })
	for i := range 4 {
		c := p.dial(t)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "live\n" {
			t.Fatalf("connection %d: greeting = %q, %v; want live", i, line, err)
		}
		c.Close()
	}
	// Each connection takes two rr positions (dead, then live), so each
	// starts at the dead backend again: one failure per connection.
	if n := p.svc.Targets[0].B.Stats().ConnectFails; n != 4 {
		t.Errorf("dead backend connect failures = %d; want 4", n)
	}
}

// TestAllDeadRefused: with every backend refusing, the client is closed at
// once, each backend tried exactly once.
func TestAllDeadRefused(t *testing.T) {
	testkit.CheckLeaks(t)
	bs := []testBackend{{"a", testkit.DeadAddr(t), 1}, {"b", testkit.DeadAddr(t), 1}, {"c", testkit.DeadAddr(t), 1}}
	p := newProxy(t, "lc", bs, func(s tuned) { s.Retries = 5 })
	c := p.dial(t)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(testkit.User(c)); isTimeout(err) {
		t.Fatal("client not closed")
	}
	for _, tg := range p.svc.Targets {
		if n := tg.B.Stats().ConnectFails; n != 1 {
			t.Errorf("backend %s tried %d times; want once", tg.B.Name, n)
		}
	}
	if line := p.logs.Wait(t, 5*time.Second, "access", isAccess); line["end"] != endConnect {
		t.Errorf("end = %v; want %q", line["end"], endConnect)
	}
}

// blackhole returns a loopback address whose accept queue is full, so that
// the kernel drops new SYNs and a dial times out, as with a dead host.
func blackhole(t *testing.T) string {
	_, addr := fullQueue(t)
	return addr
}

// TestAllDeadTimeout: with every backend silently dropping SYNs, the client
// is closed after (retries+1) connect timeouts, not later.
func TestAllDeadTimeout(t *testing.T) {
	testkit.CheckLeaks(t)
	const timeout = 300 * time.Millisecond
	bs := []testBackend{{"a", blackhole(t), 1}, {"b", blackhole(t), 1}, {"c", blackhole(t), 1}}
	p := newProxy(t, "rr", bs, func(s tuned) { s.ConnectTimeout, s.Retries = timeout, 2 })
	c := p.dial(t)
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(testkit.User(c)); isTimeout(err) {
		t.Fatal("client not closed within 10s")
	}
	elapsed := time.Since(start)
	want := 3 * timeout
	if elapsed < want*9/10 || elapsed > want+time.Second {
		t.Errorf("client closed after %v; want about %v (3 attempts × %v)", elapsed, want, timeout)
	}
	for _, tg := range p.svc.Targets {
		if n := tg.B.Stats().ConnectFails; n != 1 {
			t.Errorf("backend %s: %d connect failures; want 1", tg.B.Name, n)
		}
	}
}

// TestWRROrder: sequential connections through a wrr 8/6/4/2 service reach
// the backends in the LVS order.
func TestWRROrder(t *testing.T) {
	testkit.CheckLeaks(t)
	var bs []testBackend
	for i, w := range []int{8, 6, 4, 2} {
		name := string(rune('A' + i))
		bs = append(bs, testBackend{name, testkit.NewServer(t, testkit.Greeter(name)).Addr, w})
	}
	p := newProxy(t, "wrr", bs, nil)
	var got strings.Builder
	for range 20 {
		c := p.dial(t)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got.WriteString(strings.TrimSpace(line))
		c.Close()
	}
	if want := "AABABCABCDAABABCABCD"; got.String() != want {
		t.Errorf("order = %s; want %s (LVS ip_vs_wrr.c)", got.String(), want)
	}
}

// TestConcurrent holds 1,000 proxied connections open at once, each doing a
// request/response, then closes them all.
func TestConcurrent(t *testing.T) { testConcurrent(t) }

// testConcurrent is TestConcurrent with opts applied to every Server it starts (TestLoops).
func testConcurrent(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	const n = 1000
	bs := []testBackend{{"a", testkit.NewServer(t, testkit.Echo).Addr, 1}, {"b", testkit.NewServer(t, testkit.Echo).Addr, 1}}
	p := newProxy(t, "lc", bs, nil, opts...)
	conns := make([]*net.TCPConn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := net.DialTimeout("tcp", p.addr, 30*time.Second) // a full backlog retries SYNs after 1s, 3s, …
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c.(*net.TCPConn)
		defer c.Close()
		wg.Add(1)
		go func() { // exits after one round trip
			defer wg.Done()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			msg := fmt.Appendf(nil, "ping %d\n", i)
			if _, err := c.Write(msg); err != nil {
				errs <- err
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				errs <- fmt.Errorf("conn %d: echo %q, %v", i, got, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// lc balances, but accepts are handled concurrently: two may read the
	// same counts and pick the same backend, so allow a few off.
	a, b := p.svc.Targets[0].B.Active(), p.svc.Targets[1].B.Active()
	if a+b != n || a < n/2-n/20 || b < n/2-n/20 {
		t.Errorf("active = %d + %d; want %d, balanced by lc", a, b, n)
	}
	for _, c := range conns {
		c.Close()
	}
	// Every connection logs once it is torn down. Under -race on a loaded
	// machine 1,000 teardowns can take long, so wait while lines keep
	// coming: fail only when none came for 20s, or after 2 minutes in all.
	lines, last := 0, time.Now()
	for end := time.Now().Add(2 * time.Minute); lines < n; time.Sleep(20 * time.Millisecond) {
		if got := len(p.logs.All(isAccess)); got > lines {
			lines, last = got, time.Now()
		}
		if now := time.Now(); now.Sub(last) > 20*time.Second || now.After(end) {
			t.Fatalf("%d of %d access lines; the last came %v ago", lines, n, now.Sub(last).Round(time.Millisecond))
		}
	}
}

// TestIdleTimeout: a connection with no traffic either way is closed after
// idle_timeout; one where only the backend talks, slowly, is not.
//
// The trickle writes every idle/10, so only a stall of 9/10 of idle_timeout
// cuts it; the backend measures its own gaps, and a cut after a gap of a
// whole idle_timeout (a machine that stalled it) is legitimate: skipped,
// not failed.
func TestIdleTimeout(t *testing.T) { testIdleTimeout(t) }

// testIdleTimeout is TestIdleTimeout with opts applied to every Server it starts (TestLoops).
func testIdleTimeout(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	const idle = time.Second
	release := make(chan struct{})
	var maxGap atomic.Int64 // the longest pause between two trickle writes, in ns
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			return
		}
		if b[0] == 'q' { // quiet: say nothing
			c.Read(b[:])
			return
		}
		// trickle: one byte every idle/10 for 3 idle periods, then wait for the test
		last := time.Now()
		for range 30 {
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
			time.Sleep(idle / 10) // the traffic pattern under test, not synchronisation
			if gap := time.Since(last); gap > time.Duration(maxGap.Load()) {
				maxGap.Store(int64(gap))
			}
			last = time.Now()
		}
		<-release
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.IdleTimeout = idle }, opts...)

	quiet := p.dial(t)
	start := time.Now()
	quiet.Write([]byte{'q'})
	quiet.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(testkit.User(quiet)); isTimeout(err) {
		t.Fatal("idle connection not closed")
	}
	if el := time.Since(start); el < idle || el > idle+10*time.Second { // never early; late only by the machine's stalls
		t.Errorf("idle connection closed after %v; want about %v", el, idle)
	}
	if line := p.logs.Wait(t, 5*time.Second, "access", isAccess); line["end"] != endIdle {
		t.Errorf("end = %v; want %q", line["end"], endIdle)
	}

	trickle := p.dial(t)
	trickle.Write([]byte{'t'}) // then the client says nothing more
	trickle.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 30)
	if _, err := io.ReadFull(trickle, got); err != nil {
		close(release)
		if gap := time.Duration(maxGap.Load()); gap >= idle {
			t.Skipf("the trickle itself paused %v ≥ idle_timeout %v (a loaded machine): the cut was right", gap, idle)
		}
		t.Fatalf("trickle connection cut after %q: %v", got, err)
	}
	close(release)
}

// TestInheritedSocket: a socket passed by systemd is adopted for its
// address, handed back (still open, still queueing) when a reload removes
// that address, adopted again when it returns, and closed by Close.
func TestInheritedSocket(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil)
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.srv.Inherit(ln)
	if err != nil {
		t.Fatal(err)
	}
	base := netip.MustParseAddrPort("127.0.0.1:0")
	p.store(sched.NewTable(2, []*sched.Service{p.svc}, map[netip.AddrPort]*sched.Service{base: p.svc, a: p.svc}))
	apply := func(addrs ...netip.AddrPort) {
		ch, err := p.srv.Prepare(addrs, false)
		if err != nil {
			t.Fatal(err)
		}
		ch.Commit()
	}
	greet := func(c net.Conn) string {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	apply(base, a)
	if p.srv.Addr(a).String() != ln.Addr().String() {
		t.Fatalf("address %v not served by the inherited socket %v", p.srv.Addr(a), ln.Addr())
	}
	c, err := net.Dial("tcp", a.String())
	if err != nil || greet(c) != "a\n" {
		t.Fatalf("through the inherited socket: %v", err)
	}
	c.Close()

	apply(base) // removed: handed back, still open
	queued, err := net.DialTimeout("tcp", a.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("the handed-back socket no longer queues: %v", err)
	}
	defer queued.Close()
	apply(base, a) // back: the queued connection is served
	if got := greet(queued); got != "a\n" {
		t.Errorf("queued connection got %q after the socket came back", got)
	}
	p.srv.Close()
	if c, err := net.DialTimeout("tcp", a.String(), time.Second); err == nil {
		c.Close()
		t.Error("the inherited socket is still open after Close")
	}
}

// TestQueueOneSlot: one backend slot (max_conns 1) and a queue; 30 clients
// contend for it at once. Every one is served in turn (none is closed
// because it lost a race for the slot), and the backend never holds two.
func TestQueueOneSlot(t *testing.T) {
	testkit.CheckLeaks(t)
	var open, peak, served atomic.Int64
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		n := open.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		c.Write([]byte("in\n"))
		io.Copy(io.Discard, c)
		open.Add(-1)
	})
	p := newProxy(t, "wrr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) {
		s.Targets[0].MaxConns = 1
		s.QueueTimeout = 20 * time.Second
	})
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() { // exits when its connection ends
			defer wg.Done()
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "in\n" {
				t.Errorf("client %d: %q, %v; want served", i, line, err)
				return
			}
			served.Add(1)
		}()
	}
	wg.Wait()
	if served.Load() != 30 || peak.Load() != 1 {
		t.Errorf("served %d of 30, backend peak %d; want all 30, one at a time", served.Load(), peak.Load())
	}
}

// racyPicker returns target 0 once as if its slot were free at the pick,
// although it is not: the race a connection loses when another takes the
// last slot between its pick and its Acquire. Afterwards it follows the
// shared rule (tried, or full, means no backend).
type racyPicker struct {
	ts    []sched.Target
	first atomic.Bool
}

func (p *racyPicker) Pick(r *sched.Request) (int, error) {
	if p.first.CompareAndSwap(false, true) {
		return 0, nil
	}
	if t := &p.ts[0]; r.Tried(0) || t.B.Active() >= int64(t.MaxConns) {
		return -1, sched.ErrNoBackend
	}
	return 0, nil
}

// TestLostSlotRace: a connection that loses the last slot between its pick
// and its Acquire is not closed as "no backend": the backend is not counted
// as tried, and the connection queues until the slot frees.
func TestLostSlotRace(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	p := newProxy(t, "wrr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) {
		s.Targets[0].MaxConns = 1
		s.QueueTimeout = 10 * time.Second
		s.Picker = &racyPicker{ts: s.Targets}
	})
	b := p.svc.Targets[0].B
	if !b.Acquire(1) { // the slot is taken
		t.Fatal("acquire")
	}
	c := p.dial(t)
	testkit.WaitFor(t, 5*time.Second, func() error { // the queue has no event to wait on
		if st := p.adm().stats(); st.Waiting != 1 {
			return fmt.Errorf("the connection did not queue: %+v", st)
		}
		return nil
	})
	p.srv.releaseBackend(b) // the slot frees, as a lease gives it back: the queued connection takes it
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "a\n" {
		t.Fatalf("greeting = %q, %v; want the connection served once the slot freed", line, err)
	}
}
