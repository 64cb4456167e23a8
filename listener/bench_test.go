package listener

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/internal/testkit"
)

// quiet is the production logging of bench/run.sh's fulcrum.toml:
// access = false at level info, so no log line is built per connection.
func quiet(s tuned) { s.AccessLog = false }

// BenchmarkProxyConnection is the per-connection hot path end to end:
// connect through a Server on loopback to a loopback echo backend, one 64 B
// round trip, close. allocs/op and B/op count every allocation of the
// process, the client's and the backend's included; proxy-allocs/conn and
// proxy-B/conn subtract the same loop run straight to the backend, which
// leaves what the proxy adds per connection.
//
// It runs with one event loop and with two.
//
//	go test -run '^$' -bench ProxyConnection -benchmem ./listener/
func BenchmarkProxyConnection(b *testing.B) {
	for _, d := range designs {
		b.Run(d.name, func(b *testing.B) { benchmarkProxyConnection(b, d.opts...) })
	}
}

// designs are the event-loop counts the benchmarks compare.
var designs = []struct {
	name string
	opts []func(*Server)
}{{"loops=1", []func(*Server){withLoops(1)}}, {"loops=2", []func(*Server){withLoops(2)}}}

func benchmarkProxyConnection(b *testing.B, opts ...func(*Server)) {
	be := testkit.NewServer(b, testkit.Echo)
	p := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel, opts...)
	msg, buf := make([]byte, 64), make([]byte, 64)
	roundTrip := func(addr string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatalf("dial %s: %v", addr, err)
		}
		if _, err := c.Write(msg); err != nil {
			b.Fatalf("write: %v", err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatalf("read: %v", err)
		}
		c.Close()
	}
	// settled waits until every connection has ended at the backend (and,
	// through the proxy, every session), so that their teardown is counted.
	settled := func() {
		testkit.WaitFor(b, 10*time.Second, func() error { // teardown has no event to wait on
			if n, active := be.Open(), p.svc.Targets[0].B.Stats().Active; n != 0 || active != 0 {
				return fmt.Errorf("%d backend connections still open, %d active", n, active)
			}
			return nil
		})
	}
	// mallocs runs f n times and returns allocations and bytes per run.
	mallocs := func(n int, f func()) (allocs, bytes float64) {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range n {
			f()
		}
		settled()
		runtime.ReadMemStats(&m1)
		return float64(m1.Mallocs-m0.Mallocs) / float64(n), float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
	}

	roundTrip(p.addr) // warm: the first connection grows pools and stacks
	settled()
	directAllocs, directBytes := mallocs(200, func() { roundTrip(be.Addr) })

	b.ReportAllocs()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	n := 0
	for b.Loop() {
		roundTrip(p.addr)
		n++
	}
	settled()
	runtime.ReadMemStats(&m1)
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(n)-directAllocs, "proxy-allocs/conn")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n)-directBytes, "proxy-B/conn")
}

// BenchmarkSpliceThroughput pushes bulk bytes one way through one proxied
// connection to a backend that reads and drops them; MB/s is the proxy's
// throughput, with the drain of the last bytes inside the timing.
//
// It runs with one event loop and with two.
//
//	go test -run '^$' -bench SpliceThroughput -benchmem ./listener/
func BenchmarkSpliceThroughput(b *testing.B) {
	for _, d := range designs {
		b.Run(d.name, func(b *testing.B) { benchmarkSpliceThroughput(b, d.opts...) })
	}
}

func benchmarkSpliceThroughput(b *testing.B, opts ...func(*Server)) {
	const chunk = 256 << 10
	got := make(chan int64, 1)
	be := testkit.NewServer(b, func(c *net.TCPConn) {
		buf := make([]byte, chunk)
		var n int64
		for {
			k, err := c.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		got <- n
	})
	p := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel, opts...)
	conn, err := net.Dial("tcp", p.addr)
	if err != nil {
		b.Fatal(err)
	}
	c := conn.(*net.TCPConn)
	defer c.Close()
	data := make([]byte, chunk)
	b.SetBytes(chunk)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(data); err != nil {
			b.Fatalf("write: %v", err)
		}
	}
	c.CloseWrite()
	n := <-got
	b.StopTimer()
	if want := int64(b.N) * chunk; n != want {
		b.Fatalf("backend read %d bytes; want %d", n, want)
	}
}
