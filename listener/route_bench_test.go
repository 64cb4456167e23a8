package listener

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// BenchmarkRoutingCost is the CPU a new connection costs the proxy with
// routing by name against without it. Every connection sends the same
// ClientHello (crypto/tls's, about 1.8 KiB with its post-quantum key
// share), the backend answers one byte once the hello has arrived, and the
// client closes. The plain proxy, the routed one and a direct run to the
// backend (the client's and the backend's own cost) take turns in batches,
// so that a busy machine weighs on all three alike; process CPU time
// (getrusage) per connection minus the direct run's is what each proxy
// costs: plain-cpu-µs/conn, routed-cpu-µs/conn, and their ratio routed/plain.
//
//	go test -run '^$' -bench RoutingCost -benchtime 3000x -count 5 ./listener/
func BenchmarkRoutingCost(b *testing.B) {
	hello := testkit.ClientHello(b, &tls.Config{ServerName: "db1.example.com"})
	be := testkit.NewServer(b, func(c *net.TCPConn) {
		buf := make([]byte, len(hello))
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		c.Write([]byte{1})
		c.Read(buf[:1]) // the client's close
	})
	plain := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel)
	routed := startRouted(b, zerolog.InfoLevel, []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{be.Addr}, tune: quiet},
		{name: "other", sni: []string{"*.tenants.example.com"}, backends: []string{testkit.DeadAddr(b)}, tune: quiet},
		{name: "default", sni: []string{"*"}, backends: []string{testkit.DeadAddr(b)}, tune: quiet},
	})
	var one [1]byte
	conn := func(addr string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatalf("dial %s: %v", addr, err)
		}
		if _, err := c.Write(hello); err != nil {
			b.Fatalf("write: %v", err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatalf("read: %v", err)
		}
		c.Close()
	}
	settled := func() {
		testkit.WaitFor(b, 10*time.Second, func() error { // teardown has no event to wait on
			if n := be.Open(); n > 0 {
				return fmt.Errorf("%d backend connections still open", n)
			}
			return nil
		})
	}
	cpu := func() time.Duration {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	batch := func(addr string, n int) time.Duration {
		settled()
		t0 := cpu()
		for range n {
			conn(addr)
		}
		settled()
		return cpu() - t0
	}
	conn(plain.addr) // warm: pools and stacks
	conn(routed.addr)
	settled()

	const size = 100
	var direct, p, r time.Duration
	n := 0
	b.ResetTimer()
	for n < b.N {
		k := min(size, b.N-n)
		direct += batch(be.Addr, k)
		p += batch(plain.addr, k)
		r += batch(routed.addr, k)
		n += k
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d-direct) / float64(n) / float64(time.Microsecond) }
	b.ReportMetric(per(p), "plain-cpu-µs/conn")
	b.ReportMetric(per(r), "routed-cpu-µs/conn")
	b.ReportMetric(per(r)/per(p), "routed/plain")
}

// BenchmarkChoose is the routing step alone on its fast path: a ClientHello
// already in the socket, peeked, parsed and matched. It consumes nothing,
// so every iteration sees the same hello.
//
//	go test -run '^$' -bench Choose -benchmem ./listener/
func BenchmarkChoose(b *testing.B) {
	hello := testkit.ClientHello(b, &tls.Config{ServerName: "a.tenants.example.com", NextProtos: []string{"h2", "http/1.1"}})
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := ln.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := c.Write(hello); err != nil {
		b.Fatal(err)
	}
	fd := dupFD(s)
	defer sockfd.Close(fd)
	tenants := &sched.Service{Name: "tenants"}
	rs, err := sched.NewRoutes([]sched.Route{
		{Service: &sched.Service{Name: "db1"}, Names: []string{"db1.example.com"}},
		{Service: tenants, Names: []string{"*.tenants.example.com"}},
		{Service: &sched.Service{Name: "default"}, Names: []string{"*"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	if svc, _, err := choose(fd, rs, nil); err != nil || svc != tenants { // waits for the hello to arrive
		b.Fatalf("choose = %v, %v; want tenants", svc, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if svc, _, err := choose(fd, rs, nil); err != nil || svc != tenants {
			b.Fatalf("choose = %v, %v; want tenants", svc, err)
		}
	}
}
