package listener

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/internal/testkit"
)

// BenchmarkEchoBesideBulk is the loop's fairness: the round trip of a
// 1-byte echo through the proxy, alone, beside a session moving bulk bytes
// both ways on the same event loop, and beside one on another loop. It
// reports the echo's p50, p99 and worst round trip; a direction's inline
// run per kick is bounded in bytes (runBudget), so the bulk session holds
// the small one up by at most that much copying.
//
//	go test -run '^$' -bench EchoBesideBulk ./listener/
func BenchmarkEchoBesideBulk(b *testing.B) {
	for _, c := range []struct {
		name  string
		loops int
		bulk  bool
	}{{"alone", 1, false}, {"same-loop", 1, true}, {"other-loop", 2, true}} {
		b.Run(c.name, func(b *testing.B) { benchmarkEchoBesideBulk(b, c.loops, c.bulk) })
	}
}

func benchmarkEchoBesideBulk(b *testing.B, loops int, bulk bool) {
	be := testkit.NewServer(b, func(c *net.TCPConn) {
		kind := make([]byte, 1)
		if _, err := io.ReadFull(c, kind); err != nil {
			return
		}
		if kind[0] == 'B' { // bulk both ways, until the client closes
			go func() { // exits when the connection is closed
				buf := make([]byte, 256<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
			io.Copy(io.Discard, testkit.User(c))
			return
		}
		io.Copy(c, c) // the echo
	})
	p := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel, withLoops(loops))
	if bulk {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte{'B'})
		go func() { // exits when c is closed
			buf := make([]byte, 256<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		go io.Copy(io.Discard, testkit.User(c.(*net.TCPConn))) // exits when c is closed
	}
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{'E'})
	one := make([]byte, 1)
	var rtt []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Write(one); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, time.Since(t0))
	}
	slices.Sort(rtt)
	at := func(q float64) float64 { return float64(rtt[int(q*float64(len(rtt)-1))].Microseconds()) }
	b.ReportMetric(at(0.5), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(at(1), "max-µs")
}
