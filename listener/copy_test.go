package listener

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// pattern is the payload of the copy tests: random bytes that repeat with a
// prime period, so that a lost, repeated or reordered chunk shows whatever
// its size.
var pattern = func() []byte {
	r := rand.New(rand.NewPCG(7, 11))
	b := make([]byte, 999_983)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

// writePattern writes n bytes of the pattern to w, in writes whose sizes
// next returns (nil: 64 KiB).
func writePattern(w io.Writer, n int, next func() int) error {
	for off := 0; off < n; {
		k := 64 << 10
		if next != nil {
			k = next()
		}
		k = min(k, n-off)
		i := off % len(pattern)
		k = min(k, len(pattern)-i)
		if _, err := w.Write(pattern[i : i+k]); err != nil {
			return err
		}
		off += k
	}
	return nil
}

// readPattern reads r to EOF in reads whose sizes next returns (nil: 64
// KiB) and compares every byte with the pattern. It returns how many bytes
// matched before EOF, a difference or an error.
func readPattern(r io.Reader, next func() int) (int, error) {
	buf := make([]byte, 256<<10)
	off := 0
	for {
		k := 64 << 10
		if next != nil {
			k = next()
		}
		n, err := r.Read(buf[:min(k, len(buf))])
		for got := buf[:n]; len(got) > 0; {
			i := off % len(pattern)
			m := min(len(got), len(pattern)-i)
			if !bytes.Equal(got[:m], pattern[i:i+m]) {
				for j := range m {
					if got[j] != pattern[i+j] {
						return off + j, fmt.Errorf("byte %d differs", off+j)
					}
				}
			}
			got, off = got[m:], off+m
		}
		if err == io.EOF {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

// echoThrough sends n pattern bytes through p to an echo backend, shuts the
// write side, and checks that exactly the same n bytes come back before EOF.
func echoThrough(t *testing.T, p *testProxy, n int, wsize, rsize func() int) {
	t.Helper()
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	werr := make(chan error, 1)
	go func() { // exits when the payload is written
		err := writePattern(testkit.User(c), n, wsize)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	got, err := readPattern(testkit.User(c), rsize)
	if err != nil || got != n {
		// What the proxy said, to tell a refused or failed dial from a
		// session that broke.
		for _, m := range p.logs.All(func(m map[string]any) bool { return m["level"] != "debug" || isAccess(m) }) {
			t.Logf("proxy log: %v", m)
		}
		t.Fatalf("echo of %d bytes: %d matched, %v", n, got, err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
}

// waitNoPipeLent waits until every pipe the proxy has is back in its pool.
func waitNoPipeLent(t *testing.T, p *testProxy) {
	t.Helper()
	pp := &p.srv.pipes
	// A pipe comes back when its direction next finds nothing to read: no
	// event to wait on.
	testkit.WaitFor(t, 5*time.Second, func() error {
		if open, idle := pp.open.Load(), pp.idleCount(); open != int64(idle) {
			return fmt.Errorf("%d pipes open, %d of them pooled: a pipe is still lent", open, idle)
		}
		return nil
	})
}

// TestPayloads echoes payloads of every size class through each copy mode,
// with a half-close, and compares them byte for byte. It also checks that
// the mode took the path it names: the buffer path lends no pipe, the
// splice path does.
func TestPayloads(t *testing.T) { testPayloads(t) }

// testPayloads is TestPayloads with opts applied to every Server it starts (TestLoops).
func testPayloads(t *testing.T, opts ...func(*Server)) {
	sizes := []int{1, 100, 64 << 10, 3_000_000, 50_000_000}
	for _, mode := range []copyMode{copyBuffer, copySplice, copyAuto} {
		t.Run(mode.String(), func(t *testing.T) {
			testkit.CheckLeaks(t)
			be := testkit.NewServer(t, testkit.Echo)
			p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(mode))...)
			for _, n := range sizes {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					lent := p.srv.pipes.lent.Load()
					echoThrough(t, p, n, nil, nil)
					line := p.logs.Wait(t, 10*time.Second, "access", func(m map[string]any) bool {
						return isAccess(m) && m["bytes_in"] == float64(n)
					})
					if line["bytes_out"] != float64(n) || line["end"] != endClient {
						t.Errorf("access line = %v; want %d bytes each way, end %q", line, n, endClient)
					}
					spliced := p.srv.pipes.lent.Load() > lent
					switch {
					case mode == copyBuffer && spliced:
						t.Errorf("buffer mode lent a pipe")
					case mode == copySplice && !spliced:
						t.Errorf("splice mode lent no pipe")
					case mode == copyAuto && n <= 100 && spliced:
						t.Errorf("auto mode spliced %d bytes", n)
					case mode == copyAuto && n >= 3_000_000 && !spliced:
						t.Errorf("auto mode did not splice %d bytes", n)
					}
					waitNoPipeLent(t, p)
				})
			}
			st := p.svc.Targets[0].B.Stats()
			var sum uint64
			for _, n := range sizes {
				sum += uint64(n)
			}
			if st.BytesIn != sum || st.BytesOut != sum || st.Active != 0 {
				t.Errorf("backend stats = %+v; want %d bytes each way, none active", st, sum)
			}
		})
	}
}

// TestPipeNotHeldWhileIdle: a connection that has spliced megabytes and then
// goes quiet holds no pipe, and its counters are live before it ends.
func TestPipeNotHeldWhileIdle(t *testing.T) { testPipeNotHeldWhileIdle(t) }

// testPipeNotHeldWhileIdle is TestPipeNotHeldWhileIdle with opts applied to every Server it starts (TestLoops).
func testPipeNotHeldWhileIdle(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, opts...)
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	const n = 3_000_000
	werr := make(chan error, 1)
	go func() { werr <- writePattern(testkit.User(c), n, nil) }() // exits when written
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:len(pattern)], pattern) {
		t.Fatal("echo differs")
	}
	if p.srv.pipes.lent.Load() == 0 {
		t.Fatal("3 MB moved without a splice")
	}
	waitNoPipeLent(t, p)
	if st := p.svc.Targets[0].B.Stats(); st.BytesIn != n || st.BytesOut != n || st.Active != 1 {
		t.Errorf("live stats = %+v; want %d bytes each way on 1 open connection", st, n)
	}
	// Still alive after the pipe went back.
	c.Write([]byte("ping"))
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ping" {
		t.Fatalf("after idling: %q, %v", b, err)
	}
}

// TestResetMidSplice: a peer that resets while the proxy is splicing its
// bytes ends the session as a reset, with no pipe or descriptor left.
func TestResetMidSplice(t *testing.T) { testResetMidSplice(t) }

// testResetMidSplice is TestResetMidSplice with opts applied to every Server it starts (TestLoops).
func testResetMidSplice(t *testing.T, opts ...func(*Server)) {
	const chunk = 256 << 10
	t.Run("backend", func(t *testing.T) {
		testkit.CheckLeaks(t)
		rst := make(chan struct{})
		be := testkit.NewServer(t, func(c *net.TCPConn) {
			for i := 0; ; i++ {
				select {
				case <-rst:
					c.SetLinger(0)
					c.Close() // RST; NewServer's second Close is harmless
					return
				default:
				}
				if err := writePattern(c, chunk, nil); err != nil {
					return
				}
			}
		})
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(copySplice))...)
		c := p.dial(t)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 2<<20)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		close(rst)
		if _, err := io.Copy(io.Discard, testkit.User(c)); isTimeout(err) {
			t.Fatalf("client not released after the backend's reset: %v", err)
		}
		if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != endReset {
			t.Errorf("end = %v; want %q", line["end"], endReset)
		}
		waitNoPipeLent(t, p)
	})
	t.Run("client receiving", func(t *testing.T) {
		// The client stops reading with a small receive buffer, so the
		// proxy's pipe towards it fills up, then resets.
		testkit.CheckLeaks(t)
		be := testkit.NewServer(t, func(c *net.TCPConn) {
			for writePattern(c, chunk, nil) == nil { // until the proxy shuts it down
			}
		})
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(copySplice))...)
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		}}
		conn, err := d.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		c := conn.(*net.TCPConn)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		c.SetLinger(0)
		c.Close() // RST
		if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != endReset {
			t.Errorf("end = %v; want %q", line["end"], endReset)
		}
		waitNoPipeLent(t, p)
	})
	t.Run("client", func(t *testing.T) {
		testkit.CheckLeaks(t)
		read := make(chan struct{})
		be := testkit.NewServer(t, func(c *net.TCPConn) {
			buf := make([]byte, 2<<20)
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			close(read)
			io.Copy(io.Discard, testkit.User(c))
		})
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(copySplice))...)
		c := p.dial(t)
		werr := make(chan error, 1)
		go func() { // exits when the connection is reset under it
			for {
				if err := writePattern(c, chunk, nil); err != nil {
					werr <- err
					return
				}
			}
		}()
		<-read
		c.SetLinger(0)
		c.Close() // RST
		<-werr
		if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != endReset {
			t.Errorf("end = %v; want %q", line["end"], endReset)
		}
		waitNoPipeLent(t, p)
	})
}

// TestPipeFallbacks: splicing still works when a pipe cannot be resized to
// 1 MiB, and copying still works when no pipe can be had at all.
func TestPipeFallbacks(t *testing.T) { testPipeFallbacks(t) }

// testPipeFallbacks is TestPipeFallbacks with opts applied to every Server it starts (TestLoops).
func testPipeFallbacks(t *testing.T, opts ...func(*Server)) {
	t.Run("size", func(t *testing.T) {
		testkit.CheckLeaks(t)
		be := testkit.NewServer(t, testkit.Echo)
		// F_SETPIPE_SZ refuses anything above 2 GiB with EINVAL, root or not.
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(copySplice), func(s *Server) { s.pipes.size = 1<<31 + 1 })...)
		echoThrough(t, p, 3_000_000, nil, nil)
		if p.srv.pipes.lent.Load() == 0 {
			t.Error("no pipe was lent")
		}
	})
	t.Run("none", func(t *testing.T) {
		testkit.CheckLeaks(t)
		be := testkit.NewServer(t, testkit.Echo)
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, with(opts, withMode(copySplice),
			func(s *Server) { s.pipes.failedAt.Store(mono() + int64(time.Hour)) })...) // as if pipe2 had just failed
		echoThrough(t, p, 3_000_000, nil, nil)
		if n := p.srv.pipes.lent.Load(); n != 0 {
			t.Errorf("%d pipes lent; want none", n)
		}
	})
}

// randomSizes returns a source of read or write sizes from 1 byte to 256
// KiB, mostly small.
func randomSizes(r *rand.Rand) func() int {
	return func() int {
		switch r.IntN(4) {
		case 0:
			return 1 + r.IntN(16)
		case 1:
			return 1 + r.IntN(4<<10)
		case 2:
			return 1 + r.IntN(bufSize+1)
		}
		return 1 + r.IntN(256<<10)
	}
}

// FuzzCopy echoes a payload through the proxy with random write sizes at
// the client, random read and write sizes at the backend and random read
// sizes back at the client, in each copy mode, so that the copy loop sees
// short reads, full buffers, mode switches and partial writes in every
// order.
//
//	go test -run '^$' -fuzz FuzzCopy -fuzztime 1m ./listener/
func FuzzCopy(f *testing.F) {
	f.Add(uint8(0), uint64(1), uint32(1))
	f.Add(uint8(1), uint64(2), uint32(100))
	f.Add(uint8(2), uint64(3), uint32(bufSize))
	f.Add(uint8(2), uint64(4), uint32(bufSize+1))
	f.Add(uint8(2), uint64(5), uint32(1_000_000))
	f.Add(uint8(1), uint64(6), uint32(2_500_000))
	f.Add(uint8(0), uint64(7), uint32(700_001))
	f.Add(uint8(2), uint64(8), uint32(0))
	f.Add(uint8(3), uint64(9), uint32(1))
	f.Add(uint8(4), uint64(10), uint32(100))
	f.Add(uint8(5), uint64(11), uint32(bufSize))
	f.Add(uint8(5), uint64(12), uint32(3_000_000))
	f.Add(uint8(4), uint64(13), uint32(1_500_001))
	f.Add(uint8(3), uint64(14), uint32(999_999))
	f.Fuzz(func(t *testing.T, mode uint8, seed uint64, size uint32) {
		n := int(size % (4 << 20))
		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		bsizes := randomSizes(rand.New(rand.NewPCG(seed+1, seed)))
		be := testkit.NewServer(t, func(c *net.TCPConn) {
			buf := make([]byte, 256<<10)
			for {
				k, err := c.Read(buf[:bsizes()])
				for w := buf[:k]; len(w) > 0; {
					m := min(len(w), bsizes())
					if _, err := c.Write(w[:m]); err != nil {
						return
					}
					w = w[m:]
				}
				if err != nil {
					c.CloseWrite()
					return
				}
			}
		})
		opts := []func(*Server){withMode(copyMode(mode % 3))}
		if mode%6 >= 3 {
			opts = append(opts, withLoops(3))
		}
		p := startProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, zerolog.DebugLevel, opts...)
		echoThrough(t, p, n, randomSizes(r), randomSizes(rand.New(rand.NewPCG(seed+2, seed))))
		line := p.logs.Wait(t, 10*time.Second, "access", isAccess)
		if line["bytes_in"] != float64(n) || line["bytes_out"] != float64(n) {
			t.Errorf("access line = %v; want %d bytes each way", line, n)
		}
	})
}

// TestDrainClosesSession: Close on a tracked session (what a drain deadline
// does) ends both directions promptly, even one blocked writing to a client
// that does not read, and the session ends as drained.
func TestDrainClosesSession(t *testing.T) { testDrainClosesSession(t) }

// testDrainClosesSession is TestDrainClosesSession with opts applied to every Server it starts (TestLoops).
func testDrainClosesSession(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		for writePattern(c, 1<<20, nil) == nil { // until the proxy goes away
		}
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.IdleTimeout = time.Hour }, opts...)
	c := p.dial(t)
	var b [1]byte
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(b[:]); err != nil { // the session is up and data flows; now stop reading
		t.Fatal(err)
	}
	ctx, cancel := contextDone()
	defer cancel()
	start := time.Now()
	if n := p.svc.Targets[0].B.Drain(ctx); n != 1 {
		t.Fatalf("drain closed %d sessions; want 1", n)
	}
	line := p.logs.Wait(t, 5*time.Second, "access", isAccess)
	if line["end"] != endDrained {
		t.Errorf("end = %v; want %q", line["end"], endDrained)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("the drained session took %v to end", el)
	}
	_, err := io.Copy(io.Discard, testkit.User(c))
	if isTimeout(err) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("client after the drain: %v", err)
	}
}

// TestPipePool: a pipe given back empty is kept up to the cap and lent
// again; one that may still hold bytes is closed, so that no connection can
// ever send another's leftovers.
func TestPipePool(t *testing.T) {
	testkit.CheckLeaks(t)
	pp := &pipePool{size: pipeSize, max: 2}
	defer pp.closeIdle()
	a, b, c := pp.get(), pp.get(), pp.get()
	if a == nil || b == nil || c == nil {
		t.Fatal("pipe2 failed")
	}
	if sz, err := unix.FcntlInt(uintptr(a.w), unix.F_GETPIPE_SZ, 0); err != nil || sz != pipeSize {
		t.Errorf("pipe size = %d, %v; want %d", sz, err, pipeSize)
	}
	if _, err := unix.Write(a.w, []byte("left over")); err != nil {
		t.Fatal(err)
	}
	a.n = len("left over")
	x := xfer{pipes: pp, p: a}
	x.free() // a direction that ended with bytes in its pipe
	if x.p != nil || pp.idleCount() != 0 || pp.open.Load() != 2 {
		t.Fatalf("after releasing a full pipe: %d pooled, %d open; want 0 and 2", pp.idleCount(), pp.open.Load())
	}
	pp.put(b)
	pp.put(c)
	if pp.idleCount() != 2 {
		t.Fatalf("%d pooled; want 2", pp.idleCount())
	}
	d := pp.get()
	pp.put(d)
	pp.put(&pipe{r: -1, w: -1}) // over the cap: closed (closing -1 is harmless)
	if pp.idleCount() != 2 || pp.lent.Load() != 4 {
		t.Errorf("%d pooled, %d lent; want 2 and 4", pp.idleCount(), pp.lent.Load())
	}
}

// TestLoops runs the proxy tests again with one event loop and with three,
// whatever the number of Ps.
func TestLoops(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("loops=%d", n), func(t *testing.T) { testLoopsSuite(t, n) })
	}
}

func testLoopsSuite(t *testing.T, loops int) {
	for _, tt := range []struct {
		name string
		f    func(*testing.T, ...func(*Server))
	}{
		{"BulkBothWays", testBulkBothWays},
		{"HalfClose", testHalfClose},
		{"BackendClosesFirst", testBackendClosesFirst},
		{"ResetMidStream", testResetMidStream},
		{"Concurrent", testConcurrent},
		{"IdleTimeout", testIdleTimeout},
		{"Payloads", testPayloads},
		{"PipeNotHeldWhileIdle", testPipeNotHeldWhileIdle},
		{"ResetMidSplice", testResetMidSplice},
		{"PipeFallbacks", testPipeFallbacks},
		{"DrainClosesSession", testDrainClosesSession},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.f(t, withLoops(loops)) })
	}
}

// TestPipeTooSmall (S4): when F_SETPIPE_SZ fails and leaves the pipe
// smaller than a pipe worth splicing through (two pages, over the
// unprivileged pipe quota), the pool lends none and the direction copies
// through its buffer; a pipe left at a size still worth it is lent.
func TestPipeTooSmall(t *testing.T) {
	testkit.CheckLeaks(t)
	const invalid = 1<<31 + 4096 // F_SETPIPE_SZ: EINVAL, for root too; the pipe stays at 64 KiB
	small := &pipePool{size: invalid, least: 1 << 20, max: 2}
	if p := small.get(); p != nil {
		t.Fatalf("a 64 KiB pipe lent where %d is the least", small.least)
	}
	if small.open.Load() != 0 || small.failedAt.Load() == 0 {
		t.Errorf("after a pipe too small: %d open, failedAt %d; want 0 and set", small.open.Load(), small.failedAt.Load())
	}
	x := newXfer(small, copySplice)
	r, w := socketPair(t)
	unix.Write(w, []byte("hello"))
	if n, err := x.fill(r, false, pipeSize); n != 5 || err != nil || x.buf == nil {
		t.Errorf("fill with no pipe: %d, %v, buffer %v; want 5 bytes through the buffer", n, err, x.buf != nil)
	}
	x.free()
	ok := &pipePool{size: invalid, least: pipeLeast, max: 2}
	defer ok.closeIdle()
	p := ok.get()
	if p == nil {
		t.Fatal("no pipe lent at the default size")
	}
	ok.put(p)
}

// socketPair is a connected pair of non-blocking stream sockets, closed when the test ends.
func socketPair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}
