package listener_test

import (
	"bufio"
	"fmt"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
)

// TestSourceLimit: with max_conns_per_source = 10, exactly 10 of 20
// connections from one source are served.
func TestSourceLimit(t *testing.T) {
	testkit.CheckLeaks(t)
	be1 := testkit.NewServer(t, testkit.Greeter("a"))
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
max_conns_per_source = 10
backends = [{ name = "a", address = %q }]
`, be1.Addr))
	addr := p.Addr(t, "127.0.0.1:0")
	served := 0
	for range 20 {
		c, err := dialFrom("127.0.0.8", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // all held open to the end
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, _ := bufio.NewReader(c).ReadString('\n'); line == "a\n" {
			served++
		}
	}
	if served != 10 {
		t.Errorf("%d of 20 connections from one source served; want 10", served)
	}
	other, err := dialFrom("127.0.0.9", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, _ := bufio.NewReader(other).ReadString('\n'); line != "a\n" {
		t.Errorf("another source was refused too: %q", line)
	}
}
