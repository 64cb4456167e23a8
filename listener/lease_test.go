package listener

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestLeaseReleasedOnEveryEnd: whichever way a connection ends — denied,
// over its source's limit, refused as the service is full, a failed dial,
// a session that ran — everything it held is given back: the Server's
// connection slots, the service's and the source's slots, the backends'.
func TestLeaseReleasedOnEveryEnd(t *testing.T) {
	testkit.CheckLeaks(t)
	live := testkit.NewServer(t, testkit.Greeter("live"))
	dead := testkit.DeadAddr(t)
	p := newProxy(t, "rr", []testBackend{{"live", live.Addr, 1}, {"dead", dead, 1}}, func(s tuned) {
		s.Deny = []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")}
		s.MaxConnsPerSource = 1
		s.MaxConns = 1
		s.Retries = 0
	})
	dialFrom := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", p.addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	// closed awaits the proxy's close of c, having read what came first.
	closed := func(c net.Conn) string {
		t.Helper()
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	ends := func(end string) int {
		n := 0
		for _, m := range p.logs.All(isAccess) {
			if m["end"] == end {
				n++
			}
		}
		return n
	}

	// A session (rr from live), which holds a source and the service slot,
	// while others end: 127.0.0.1's next is over its source's limit,
	// 127.0.0.2's finds the service full, 127.0.0.3 is denied.
	var held net.Conn
	for range 2 { // rr: one of two picks is live; a failed dial ends the other
		c := dialFrom("127.0.0.1")
		if line, _ := bufio.NewReader(c).ReadString('\n'); line == "live\n" {
			held = c
			break
		}
		c.Close()
		p.logs.Wait(t, 10*time.Second, "the failed dial's end", func(m map[string]any) bool { return isAccess(m) && m["end"] == endConnect })
	}
	if held == nil {
		t.Fatal("no session reached the live backend")
	}
	if line := closed(dialFrom("127.0.0.1")); line != "" {
		t.Errorf("a second connection from 127.0.0.1 read %q; want it refused (max_conns_per_source = 1)", line)
	}
	if line := closed(dialFrom("127.0.0.2")); line != "" {
		t.Errorf("a connection from 127.0.0.2 read %q; want it refused (max_conns = 1)", line)
	}
	if line := closed(dialFrom("127.0.0.3")); line != "" {
		t.Errorf("a connection from 127.0.0.3 read %q; want it denied", line)
	}
	p.logs.Wait(t, 10*time.Second, "the full end", func(m map[string]any) bool { return isAccess(m) && m["end"] == endFull })
	held.Close()
	p.logs.Wait(t, 10*time.Second, "the session's end", func(m map[string]any) bool { return isAccess(m) && m["end"] == endClient })

	// Every slot is back: the Server's (but the one its accept loop takes
	// before its next accept), the service's, each source's and each
	// backend's.
	testkit.WaitFor(t, 10*time.Second, func() error {
		if n := p.srv.Limit().Open; n > 1 {
			return fmt.Errorf("%d slots of the Server's limit are held; want at most the accept loop's", n)
		}
		return nil
	})
	g := p.adm()
	if st := g.stats(); st.Active != 0 {
		t.Errorf("the service holds %d slots; want 0", st.Active)
	}
	for _, src := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		a := netip.MustParseAddr(src)
		if !g.acquireSource(a, 1) {
			t.Errorf("%s still holds its source slot", src)
			continue
		}
		g.releaseSource(a, 1)
	}
	for _, tg := range p.svc.Targets {
		if n := tg.B.Active(); n != 0 {
			t.Errorf("backend %s holds %d slots; want 0", tg.B.Name, n)
		}
	}
	if rej := g.stats().Rejected; rej[RejectDenied.String()] != 1 || rej[RejectPerSource.String()] != 1 {
		t.Errorf("rejected %v; want one denied and one per_source", rej)
	}
	if n := ends(endFull); n != 1 {
		t.Errorf("%d connections ended full; want 1", n)
	}
}
