package listener

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/sched"

	"golang.org/x/sys/unix"
)

func TestConnLimit(t *testing.T) {
	for _, c := range []struct{ nofile, want int }{{20000, 9000}, {1024, 448}, {300, 86}, {100, 1}} {
		if got := connLimit(c.nofile); got != c.want {
			t.Errorf("connLimit(%d) = %d; want %d", c.nofile, got, c.want)
		}
	}
}

// TestLocalError: besides sockfd.LocalError's shortages (tested there), a
// socket that cannot be bound to the client's address (source = "client")
// is fulcrum's own failure, not the backend's.
func TestLocalError(t *testing.T) {
	for err, local := range map[error]bool{
		fmt.Errorf("bind 10.0.0.1: %w", ErrNoTransparent):                                           true,
		fmt.Errorf("bind 10.0.0.1: %w (backend [::1]:5432)", errSourceFamily):                       true,
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", unix.EMFILE)}:        true,
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.ECONNREFUSED)}: false,
	} {
		if got := localError(err); got != local {
			t.Errorf("localError(%v) = %v; want %v", err, got, local)
		}
	}
}

// TestLimitSharedByListeners: a listener that no client uses holds no slot
// of the connection limit, so a busy one gets every slot; a client over the
// limit waits in the backlog and is served when a connection ends.
func TestLimitSharedByListeners(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	const limit = 4
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, func(s *Server) { s.slots = make(chan struct{}, limit) })
	// Three more listeners of the same service, which no client uses.
	keys := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("127.0.0.2:0"),
		netip.MustParseAddrPort("127.0.0.3:0"), netip.MustParseAddrPort("127.0.0.4:0")}
	listen := map[netip.AddrPort]*sched.Service{}
	for _, k := range keys {
		listen[k] = p.svc
	}
	p.store(sched.NewTable(2, []*sched.Service{p.svc}, listen))
	ch, err := p.srv.Prepare(keys, false)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	greeted := func(c net.Conn) (string, error) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	var conns []net.Conn
	for i := range limit {
		c := p.dial(t)
		if line, err := greeted(c); line != "a\n" {
			t.Fatalf("client %d of %d read %q, %v; want every one served while the other listeners are idle", i+1, limit, line, err)
		}
		conns = append(conns, c)
	}
	extra := p.dial(t) // over the limit: accepted once a connection ends
	p.logs.Wait(t, 10*time.Second, "the limit's warning", func(m map[string]any) bool {
		return strings.HasPrefix(fmt.Sprint(m["message"]), "connection limit reached")
	})
	conns[0].Close()
	if line, err := greeted(extra); line != "a\n" {
		t.Fatalf("the client over the limit read %q, %v once a connection ended; want it served", line, err)
	}
	p.logs.Wait(t, 10*time.Second, "the limit's end", func(m map[string]any) bool {
		return m["message"] == "below the connection limit again"
	})
}

// TestLimitLogsOnce (issue 30): clients churning at the connection limit
// begin and end an episode at it per connection; the log says so at most
// once a second (start and end), and the next line it lets through says
// how many episodes it did not log.
func TestLimitLogsOnce(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	const limit = 2
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, func(s *Server) { s.slots = make(chan struct{}, limit) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	defer halt() // on a failure too
	for range 3 * limit {
		wg.Add(1)
		go func() { // churns until stop
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
				if err != nil {
					continue
				}
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				bufio.NewReader(c).ReadString('\n')
				c.Close()
			}
		}()
	}
	start := time.Now()
	reached := func(m map[string]any) bool {
		return strings.HasPrefix(fmt.Sprint(m["message"]), "connection limit reached")
	}
	// Churn past a second, and until an episode not logged is reported.
	p.logs.Wait(t, 30*time.Second, "a limit line that reports suppressed episodes", func(m map[string]any) bool {
		n, _ := m["suppressed"].(float64)
		return reached(m) && n > 0
	})
	for p.srv.Limit().Waits < 200 && time.Since(start) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	halt()
	elapsed, waits := time.Since(start), p.srv.Limit().Waits
	lines := len(p.logs.All(func(m map[string]any) bool {
		return reached(m) || m["message"] == "below the connection limit again"
	}))
	// At most a start and an end for each second begun, and the first.
	if max := 2 * (int(elapsed/time.Second) + 2); lines > max {
		t.Errorf("%d limit lines for %d waits at the limit in %v; want at most %d", lines, waits, elapsed.Round(time.Millisecond), max)
	}
	t.Logf("%d limit lines for %d waits at the limit in %v", lines, waits, elapsed.Round(time.Millisecond))
}
