package listener_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
	"fulcrum/listener"
)

// TestAccessControl: a denied source is closed within 10 ms and the backend
// sees no connection; deny wins over allow.
func TestAccessControl(t *testing.T) {
	testkit.CheckLeaks(t)
	var conns atomic.Int64
	be1 := testkit.NewServer(t, func(c *net.TCPConn) { conns.Add(1); testkit.Greeter("a")(c) })
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
allow = ["127.0.0.0/24", "::1"]
deny = ["127.0.0.66"]
backends = [{ name = "a", address = %q }]
`, be1.Addr))
	addr := p.Addr(t, "127.0.0.1:0")
	for _, from := range []string{"127.0.0.66", "127.0.1.5"} { // denied; not allowed
		c, err := dialFrom(from, addr)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		el := time.Since(start)
		c.Close()
		if len(b) != 0 || el > 10*time.Millisecond*busy() {
			t.Errorf("from %s: got %q, closed after %v; want closed at once", from, b, el)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the backend saw %d connections from denied sources", n)
	}
	c, err := dialFrom("127.0.0.7", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, _ := bufio.NewReader(c).ReadString('\n'); line != "a\n" {
		t.Errorf("an allowed source got %q", line)
	}
	c.Close()
	if n := p.Admission(p.Snapshot().Services[0].Name).Rejected[listener.RejectDenied.String()]; n != 2 {
		t.Errorf("denied count = %d; want 2", n)
	}
	p.Logs.Wait(t, time.Second, "rejection log", testkit.Message("connection rejected"))
}
