package listener

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"fulcrum/internal/testkit"
)

// BenchmarkRoundTrip: 64 B echoed through the proxy on one connection, one
// round trip at a time, with the context switches of the process's
// threads per round trip (client, backend and proxy together: a wake-up
// the proxy saves or adds shows here). The proxy's syscalls per round trip
// are bench/run.sh's SYSCALLS pass (perf or strace from outside).
func BenchmarkRoundTrip(b *testing.B) {
	be := testkit.NewServer(b, testkit.Echo)
	p := startProxy(b, "rr", []testBackend{{"a", be.Addr, 1}}, quiet, zerolog.InfoLevel, withLoops(1))
	c := p.dial(b)
	buf := make([]byte, 64)
	rt := func() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	rt() // the session is up and its loop started
	s0 := ctxSwitches(b)
	b.ResetTimer()
	for range b.N {
		rt()
	}
	b.StopTimer()
	b.ReportMetric(float64(ctxSwitches(b)-s0)/float64(b.N), "ctxsw/op")
}

// ctxSwitches is the context switches of every thread of the process.
func ctxSwitches(b *testing.B) (n int) {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				m, _ := strconv.Atoi(strings.TrimSpace(v))
				n += m
			}
		}
	}
	return n
}
