package listener_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
)

// backendLine matches the health transition of one backend in the log.
func backendLine(msg, name string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["message"] == msg && m["backend"] == name }
}

// TestHold: with hold_timeout, connections that arrive while no backend is
// eligible wait, and are served in arrival order once one comes up; without
// a backend coming up, they are closed when hold_timeout runs out.
func TestHold(t *testing.T) {
	testkit.CheckLeaks(t)
	addr := testkit.DeadAddr(t)
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
scheduler = "first"
drain_timeout = "3s"
hold_timeout = "10s"
max_conns = 8
backends = [{ name = "a", address = %q }]
%s`, addr, health))
	front := p.Addr(t, "127.0.0.1:0")
	p.Logs.Wait(t, 5*time.Second, "a down", backendLine("backend down", "a"))
	type result struct {
		i    int
		name string
		err  error
		at   time.Time
	}
	const n = 4
	results := make(chan result, n)
	for i := range n {
		c, err := net.Dial("tcp", front)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		testkit.WaitFor(t, 5*time.Second, func() error { // arrival order needs each to be queued before the next connects
			if n := p.Admission("s").Holding; n != int64(i+1) {
				return fmt.Errorf("connection %d is not held (holding %d)", i, n)
			}
			return nil
		})
		go func() { // exits when the greeting arrives or the deadline passes
			c.SetReadDeadline(time.Now().Add(15 * time.Second))
			s, err := bufio.NewReader(c).ReadString('\n')
			results <- result{i, strings.TrimSpace(s), err, time.Now()}
		}()
	}
	up := time.Now()
	testkit.NewServerAt(t, addr, testkit.Greeter("a"))
	for range n {
		res := <-results
		if res.err != nil || res.name != "a" {
			t.Errorf("held connection %d: %q, %v; want served by a", res.i, res.name, res.err)
		}
	}
	t.Logf("held connections served %v after the backend came up", time.Since(up).Round(time.Millisecond))
	if h := p.Admission("s"); h.Held != n || h.Holding != 0 || h.HoldExpired != 0 {
		t.Errorf("Admission = %+v; want %d held, none holding or expired", h, n)
	}

	// Nothing comes up: closed when hold_timeout runs out.
	p2 := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
scheduler = "first"
drain_timeout = "3s"
hold_timeout = "300ms"
backends = [{ name = "a", address = %q }]
%s`, testkit.DeadAddr(t), health))
	p2.Logs.Wait(t, 5*time.Second, "a down", backendLine("backend down", "a"))
	start := time.Now()
	if name, err := testkit.Greeting(p2.Addr(t, "127.0.0.1:0")); err == nil {
		t.Errorf("with nothing eligible: %q; want closed", name)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("closed after %v; want about hold_timeout (300ms)", d)
	}
	if h := p2.Admission("s"); h.HoldExpired != 1 {
		t.Errorf("Expired = %d; want 1", h.HoldExpired)
	}
}
