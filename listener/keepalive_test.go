package listener

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// sockKeepAlive is what getsockopt says of one socket.
type sockKeepAlive struct{ on, idle, interval, count int }

// legKeepAlives reads the keepalive of this process's TCP sockets: those
// whose local address is local (accepted legs) and those whose peer is peer
// (dialled legs).
func legKeepAlives(t *testing.T, local, peer netip.AddrPort) (accepted, dialled []sockKeepAlive) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	addr := func(sa unix.Sockaddr) netip.AddrPort {
		if a, ok := sa.(*unix.SockaddrInet4); ok {
			return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
		}
		return netip.AddrPort{}
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ls, err1 := unix.Getsockname(fd)
		ps, err2 := unix.Getpeername(fd)
		if err1 != nil || err2 != nil {
			continue
		}
		var k sockKeepAlive
		k.on, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		k.idle, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		k.interval, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		k.count, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		switch {
		case addr(ls) == local:
			accepted = append(accepted, k)
		case addr(ps) == peer:
			dialled = append(dialled, k)
		}
	}
	return accepted, dialled
}

// TestKeepAlivePerSocket: both legs of each connection get the service's
// keepalive, with the idle time spread ±20% per socket (so that a burst of
// connections never probes in step); keepalive_idle = 0 turns it off on
// both legs.
func TestKeepAlivePerSocket(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	for _, c := range []struct {
		name string
		idle time.Duration
	}{{"on", 100 * time.Second}, {"off", 0}} {
		t.Run(c.name, func(t *testing.T) {
			p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) {
				s.KeepAliveIdle, s.KeepAliveInterval, s.KeepAliveCount = c.idle, 7*time.Second, 3
			})
			const n = 40
			var conns []*net.TCPConn
			defer func() {
				for _, cn := range conns {
					cn.Close()
				}
			}()
			for range n {
				cn := p.dial(t)
				conns = append(conns, cn)
				cn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if line, err := bufio.NewReader(cn).ReadString('\n'); err != nil || line != "a\n" {
					t.Fatalf("greeting %q, %v", line, err)
				}
			}
			accepted, dialled := legKeepAlives(t, netip.MustParseAddrPort(p.addr), netip.MustParseAddrPort(be.Addr))
			if len(accepted) != n || len(dialled) != n {
				t.Fatalf("found %d accepted and %d dialled sockets; want %d each", len(accepted), len(dialled), n)
			}
			idles := map[int]bool{}
			for i, k := range append(accepted, dialled...) {
				leg := map[bool]string{true: "accepted", false: "dialled"}[i < n]
				if c.idle == 0 {
					if k.on != 0 {
						t.Errorf("%s socket: keepalive on with keepalive_idle = 0", leg)
					}
					continue
				}
				if k.on != 1 || k.idle < 80 || k.idle > 120 || k.interval != 7 || k.count != 3 {
					t.Errorf("%s socket: keepalive %d, idle %ds, interval %ds, count %d; want on, 80..120s, 7s, 3", leg, k.on, k.idle, k.interval, k.count)
				}
				idles[k.idle] = true
			}
			if c.idle > 0 && len(idles) < 10 { // 80 draws over 41 values
				t.Errorf("idle times of %d sockets take %d values; want them spread", 2*n, len(idles))
			}
		})
	}
}

// TestJitteredIdle: the spread stays within ±20%, in whole seconds.
func TestJitteredIdle(t *testing.T) {
	for range 1000 {
		if v := jitteredIdle(time.Minute); v < 48 || v > 72 {
			t.Fatalf("jitteredIdle(1m) = %d; want 48..72", v)
		}
	}
	if v := jitteredIdle(time.Second); v != 1 {
		t.Errorf("jitteredIdle(1s) = %d; want 1", v)
	}
}
