package listener_test

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
)

// TestMaxConns: max_conns = 5 with 20 clients. The backend never holds more
// than 5; without a queue the other 15 are refused at once, with one they
// are served as slots free.
func TestMaxConns(t *testing.T) {
	testkit.CheckLeaks(t)
	for _, queue := range []time.Duration{0, 20 * time.Second} {
		t.Run(fmt.Sprintf("queue_timeout=%v", queue), func(t *testing.T) {
			h := &testkit.Holder{}
			be1 := testkit.NewServer(t, h.Handle)
			p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
queue_timeout = %q
backends = [{ name = "a", address = %q, max_conns = 5 }]
`, queue, be1.Addr))
			addr := p.Addr(t, "127.0.0.1:0")
			var wg sync.WaitGroup
			var served, refused atomic.Int64
			for range 20 {
				wg.Add(1)
				go func() { // exits when its connection ends
					defer wg.Done()
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					start := time.Now()
					c.SetDeadline(time.Now().Add(30 * time.Second))
					line, err := bufio.NewReader(c).ReadString('\n')
					if err != nil {
						if queue > 0 {
							t.Logf("client error with a queue after %v: %v", time.Since(start), err)
						}
						refused.Add(1)
						if queue == 0 && time.Since(start) > time.Second {
							t.Errorf("refused after %v; want at once", time.Since(start))
						}
						return
					}
					if line == "in\n" {
						served.Add(1)
						time.Sleep(200 * time.Millisecond) // hold the slot a while: the workload
					}
				}()
			}
			wg.Wait()
			if peak := h.Peak.Load(); peak > 5 {
				t.Errorf("the backend held %d connections at once; max_conns is 5", peak)
			}
			st := p.Admission(p.Snapshot().Services[0].Name)
			if queue == 0 {
				if served.Load() < 5 || refused.Load() != 20-served.Load() || st.Refused != uint64(refused.Load()) {
					t.Errorf("served %d, refused %d (counted %d); want 5 served at once and the rest refused", served.Load(), refused.Load(), st.Refused)
				}
			} else if served.Load() != 20 || st.Queued == 0 {
				t.Errorf("served %d of 20 with a queue (queued %d, refused %d)", served.Load(), st.Queued, st.Refused)
			}
			t.Logf("max_conns 5, queue_timeout %v: %d served, %d refused, backend peak %d, %d queued", queue, served.Load(), refused.Load(), h.Peak.Load(), st.Queued)
		})
	}
}
