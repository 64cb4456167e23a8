package listener_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
)

// await polls cond until it holds, failing the test with what after d.
func await(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, d, func() error {
		if !cond() {
			return errors.New(what)
		}
		return nil
	})
}

// ghostBackend greets with "in" and records whether any connection brought
// "hello", what the departed clients sent before they left.
type ghostBackend struct{ ghosts atomic.Int64 }

func (g *ghostBackend) handle(c *net.TCPConn) {
	c.Write([]byte("in\n"))
	b, _ := io.ReadAll(c)
	if strings.Contains(string(b), "hello") {
		g.ghosts.Add(1)
	}
}

// goneLine matches the access line of a connection whose client left
// while it waited.
func goneLine(m map[string]any) bool {
	return m["message"] == "connection" && m["end"] == "client gone"
}

// TestHeldClientGone (issue 30): a client that leaves while held
// (hold_timeout) gives its service slot back while the hold goes on, and
// is never dialled when the backend comes back; a live client arriving
// after it is held in its place, not refused, and is the only one served.
func TestHeldClientGone(t *testing.T) {
	testkit.CheckLeaks(t)
	addr := testkit.DeadAddr(t)
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
hold_timeout = "30s"
max_conns = 1
backends = [{ name = "a", address = %q }]
[services.s.health]
check = "tcp"
interval = "100ms"
timeout = "100ms"
rise = 1
fall = 1
`, addr))
	front := p.Addr(t, "127.0.0.1:0")
	p.Logs.Wait(t, 5*time.Second, "a down", backendLine("backend down", "a"))

	a, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("hello")) // what a client sends before it gives up
	await(t, 5*time.Second, "the first client is held", func() bool { return p.Admission("s").Holding == 1 })
	a.Close()
	// Released while nothing is up yet: well before hold_timeout (30s).
	await(t, 5*time.Second, "the departed client gives its hold up", func() bool { return p.Admission("s").Holding == 0 })
	p.Logs.Wait(t, 5*time.Second, "the access line of the departed client", goneLine)

	b, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	await(t, 5*time.Second, "the live client is held (its slot was given back)", func() bool { return p.Admission("s").Holding == 1 })
	gb := &ghostBackend{}
	testkit.NewServerAt(t, addr, gb.handle)
	b.SetReadDeadline(time.Now().Add(15 * time.Second))
	if line, err := bufio.NewReader(b).ReadString('\n'); err != nil || line != "in\n" {
		t.Fatalf("live held client: %q, %v; want served", line, err)
	}
	b.Close()
	p.Logs.Wait(t, 5*time.Second, "the live client's access line", func(m map[string]any) bool {
		return m["message"] == "connection" && m["backend"] == "a"
	})
	if n := gb.ghosts.Load(); n != 0 {
		t.Errorf("the backend was dialled %d times for the departed client; want never", n)
	}
	if st := p.Admission("s"); st.Refused != 0 {
		t.Errorf("%d refused; want none", st.Refused)
	}
}

// TestQueuedClientGone (issue 30): a client that leaves while queued for
// a service slot or a backend slot (queue_timeout) leaves the queue then,
// not at queue_timeout, and is never dialled when a slot frees.
func TestQueuedClientGone(t *testing.T) {
	testkit.CheckLeaks(t)
	for _, tc := range []struct{ name, service, backend string }{
		{"service", "max_conns = 1", ""},
		{"backend", "", ", max_conns = 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gb := &ghostBackend{}
			be := testkit.NewServer(t, gb.handle)
			p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "3s"
queue_timeout = "30s"
%s
backends = [{ name = "a", address = %q%s }]
`, tc.service, be.Addr, tc.backend))
			front := p.Addr(t, "127.0.0.1:0")
			greet := func(c net.Conn) {
				t.Helper()
				c.SetReadDeadline(time.Now().Add(15 * time.Second))
				if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "in\n" {
					t.Fatalf("%q, %v; want served", line, err)
				}
			}
			x, err := net.Dial("tcp", front) // takes the one slot
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			greet(x)

			a, err := net.Dial("tcp", front)
			if err != nil {
				t.Fatal(err)
			}
			a.Write([]byte("hello"))
			await(t, 5*time.Second, "the client is queued", func() bool { return p.Admission("s").Waiting == 1 })
			a.Close()
			await(t, 5*time.Second, "the departed client leaves the queue", func() bool { return p.Admission("s").Waiting == 0 })
			p.Logs.Wait(t, 5*time.Second, "the access line of the departed client", goneLine)

			b, err := net.Dial("tcp", front)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			await(t, 5*time.Second, "the live client is queued", func() bool { return p.Admission("s").Waiting == 1 })
			x.Close()
			greet(b)
			b.Close()
			await(t, 5*time.Second, "both served clients' access lines", func() bool {
				return len(p.Logs.All(func(m map[string]any) bool { return m["message"] == "connection" && m["backend"] == "a" })) == 2
			})
			if n := gb.ghosts.Load(); n != 0 {
				t.Errorf("the backend was dialled %d times for the departed client; want never", n)
			}
		})
	}
}
