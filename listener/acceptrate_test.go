package listener_test

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
	"fulcrum/listener"
)

// TestAcceptRate: accept_rate = 5 with a burst of 5 lets 5 of 20 connections
// made at once through, and refuses the rest at once.
func TestAcceptRate(t *testing.T) {
	testkit.CheckLeaks(t)
	be1 := testkit.NewServer(t, testkit.Greeter("a"))
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
accept_rate = 5
accept_burst = 5
backends = [{ name = "a", address = %q }]
`, be1.Addr))
	addr := p.Addr(t, "127.0.0.1:0")
	served := 0
	start := time.Now()
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, _ := bufio.NewReader(c).ReadString('\n'); line == "a\n" {
			served++
		}
		c.Close()
	}
	// 5 from the bucket, plus at most one refill per 200 ms elapsed.
	if refills := int(time.Since(start) / (200 * time.Millisecond)); served < 5 || served > 5+refills {
		t.Errorf("%d of 20 served in %v; want the burst of 5 (+%d refills)", served, time.Since(start), refills)
	}
	if n := p.Admission(p.Snapshot().Services[0].Name).Rejected[listener.RejectRate.String()]; int(n) != 20-served {
		t.Errorf("rate rejections = %d; want %d", n, 20-served)
	}
}
