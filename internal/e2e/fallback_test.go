package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestFallbackConnectFailed: a dial that fails on a service's fallback is
// logged as the access lines log a connection served there: service is
// the one the client asked for, backend the one dialled, and fallback the
// service that backend belongs to.
func TestFallbackConnectFailed(t *testing.T) {
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.ro]
listen   = ["127.0.0.1:0"]
fallback = "rw"
backends = [{ name = "r", address = %q }]
[services.ro.health]
check    = "tcp"
interval = "100ms"
timeout  = "100ms"
rise     = 1
fall     = 1
[services.rw]
listen   = ["127.0.0.2:0"]
backends = [{ name = "w", address = %q }]
`, testkit.DeadAddr(t), testkit.DeadAddr(t)))
	ro := ""
	for range 2 {
		if a := d.listenAddr(t); strings.HasPrefix(a, "127.0.0.1:") {
			ro = a
		}
	}
	d.awaitMatch(t, "r down", func(m map[string]any) bool { return m["message"] == "backend down" && m["backend"] == "r" })
	c, err := net.Dial("tcp", ro)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	c.Read(make([]byte, 1)) // closed once the dial of w fails
	line := d.await(t, "connect failed")
	if line["service"] != "ro" || line["backend"] != "w" || line["fallback"] != "rw" {
		t.Errorf("connect failed line %v; want service ro, backend w, fallback rw", line)
	}
}
