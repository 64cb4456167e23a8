package reload

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// free6 returns an IPv6 loopback address that was free a moment ago.
func free6(t *testing.T) string {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// dialFrom connects to addr from a chosen loopback source address.
func dialFrom(src, addr string) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// proxyReader is a backend that parses the PROXY header (v1 or v2, with
// go-proxyproto, as a real PROXY-aware server does) and answers with the
// addresses it carries.
func proxyReader(c *net.TCPConn) {
	br := bufio.NewReader(c)
	h, err := proxyproto.Read(br)
	if err != nil {
		fmt.Fprintf(c, "no header: %v\n", err)
		return
	}
	fmt.Fprintf(c, "v%d %s %s\n", h.Version, h.SourceAddr, h.DestinationAddr)
	io.Copy(io.Discard, br)
}

// TestProxyProtocolSend: backends that parse PROXY v1 and v2 see the real
// client address and port, and the address it connected to, for IPv4 and
// IPv6 clients.
func TestProxyProtocolSend(t *testing.T) {
	testkit.CheckLeaks(t)
	v1 := testkit.NewServer(t, proxyReader)
	v2 := testkit.NewServer(t, proxyReader)
	r := startRun(t, t.TempDir(), render(
		svc{name: "one", listen: []string{"127.0.0.1:0", "[::1]:0"}, scheduler: "rr", extra: `proxy_protocol = "v1"`,
			backends: []be{{"a", v1.Addr, 1, ""}}},
		svc{name: "two", listen: []string{testkit.FreeAddr(t), free6(t)}, scheduler: "rr", extra: `proxy_protocol = "none"`,
			backends: []be{{"b", v2.Addr, 1, `proxy_protocol = "v2"`}}}, // a backend overrides its service
	))
	two := r.ptr.Load().Services[1].Listen[0].String()
	two6 := r.ptr.Load().Services[1].Listen[1].String()
	cases := []struct {
		from, to, version string
	}{
		{"127.0.0.5", r.addr("127.0.0.1:0"), "v1"},
		{"::1", r.addr("[::1]:0"), "v1"},
		{"127.0.0.6", two, "v2"},
		{"::1", two6, "v2"},
	}
	for _, c := range cases {
		conn, err := dialFrom(c.from, c.to)
		if err != nil {
			t.Fatalf("dial %s from %s: %v", c.to, c.from, err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		want := fmt.Sprintf("%s %s %s\n", c.version, conn.LocalAddr(), conn.RemoteAddr())
		conn.Close()
		if err != nil || line != want {
			t.Errorf("from %s to %s: backend saw %q, %v; want %q", c.from, c.to, line, err, want)
		}
	}
}

// TestFulcrumBehindFulcrum: an outer service sends PROXY v2 to an inner one
// that accepts it from 127.0.0.1 only and schedules with sh by the original
// client address; a spoofed header from anywhere else is refused.
func TestFulcrumBehindFulcrum(t *testing.T) {
	testkit.CheckLeaks(t)
	var bs []be
	for _, n := range []string{"a", "b", "c", "d"} {
		bs = append(bs, be{n, testkit.NewServer(t, testkit.Greeter(n)).Addr, 1, ""})
	}
	inner := testkit.FreeAddr(t)
	r := startRun(t, t.TempDir(), render(
		svc{name: "outer", listen: []string{"127.0.0.1:0"}, scheduler: "rr", extra: `proxy_protocol = "v2"`,
			backends: []be{{"inner", inner, 1, ""}}},
		svc{name: "inner", listen: []string{inner}, scheduler: "sh", extra: `accept_proxy = ["127.0.0.1/32"]`, backends: bs},
	))
	outer := r.addr("127.0.0.1:0")
	chose := map[string]string{}
	for i := 2; i < 30; i++ {
		client := fmt.Sprintf("127.0.%d.%d", i, 7*i%250+2)
		for range 3 {
			c, err := dialFrom(client, outer)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			name, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				t.Fatalf("through both: %v", err)
			}
			if prev, ok := chose[client]; ok && prev != name {
				t.Errorf("client %s went to %q, then %q: sh on the inner did not use its address", client, prev, name)
			}
			chose[client] = name
		}
	}
	spread := map[string]bool{}
	for _, n := range chose {
		spread[n] = true
	}
	if len(spread) < 3 {
		t.Errorf("28 clients reached only %v: the inner hashed one address (the outer's) instead of theirs", spread)
	}
	line := r.logs.Wait(t, 5*time.Second, "inner access", func(m map[string]any) bool {
		return m["message"] == "connection" && m["service"] == "inner" && strings.HasPrefix(fmt.Sprint(m["client"]), "127.0.2.")
	})
	if line["client"] == "127.0.0.1" {
		t.Errorf("the inner logged the outer's address")
	}

	// A client trying to claim another address by talking PROXY to the
	// inner directly (it is not 127.0.0.1) is refused before any dial.
	total := uint64(0)
	for _, b := range r.ptr.Load().Services[1].Targets {
		total += b.B.Stats().Total
	}
	c, err := dialFrom("127.0.0.9", inner)
	if err != nil {
		t.Fatal(err)
	}
	h := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.IPv4(6, 6, 6, 6), Port: 1}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2})
	h.WriteTo(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	c.Close()
	after := uint64(0)
	for _, b := range r.ptr.Load().Services[1].Targets {
		after += b.B.Stats().Total
	}
	if len(got) != 0 || after != total {
		t.Errorf("a spoofed header got %q and %d backend connections; want refused", got, after-total)
	}
	if n := r.ptr.Load().Services[1].Group.Rejected()[backend.RejectProxy]; n != 1 {
		t.Errorf("proxy rejections = %d; want 1", n)
	}
}

// TestProxyProtocolReceive: from a trusted source, a header is required
// (none, malformed, or none within proxy_timeout closes the connection);
// v1, v2 and LOCAL headers are read and the payload after them arrives
// intact.
func TestProxyProtocolReceive(t *testing.T) {
	testkit.CheckLeaks(t)
	var seen sync.Map // payload → true
	echo := testkit.NewServer(t, func(c *net.TCPConn) {
		b, _ := io.ReadAll(testkit.User(c))
		seen.Store(string(b), true)
		c.Write(b)
	})
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr",
		extra: "accept_proxy = [\"127.0.0.0/8\"]\nproxy_timeout = \"2s\"", backends: []be{{"a", echo.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
	send := func(prefix []byte, payload string) (string, time.Duration) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		c.Write(append(prefix, payload...))
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b), time.Since(start)
	}
	src := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4242}
	dst := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5432}
	v1, _ := proxyproto.HeaderProxyFromAddrs(1, src, dst).Format()
	v2, _ := proxyproto.HeaderProxyFromAddrs(2, src, dst).Format()
	local, _ := (&proxyproto.Header{Version: 2, Command: proxyproto.LOCAL}).Format()
	for _, c := range []struct {
		name   string
		prefix []byte
	}{{"v1", v1}, {"v2", v2}, {"v2 LOCAL", local}} {
		payload := "payload after " + c.name + strings.Repeat("!", 3000)
		if got, _ := send(c.prefix, payload); got != payload {
			t.Errorf("%s: echo %d bytes; want the %d-byte payload intact", c.name, len(got), len(payload))
		}
	}
	badFamily := append([]byte(nil), v2...)
	badFamily[13] = 0x99
	for _, c := range []struct {
		name    string
		prefix  []byte
		payload string
	}{
		{"no header", nil, "must not arrive: no header"},
		{"malformed v1", []byte("PROXY TCP4 1.2.3.4\r\n"), "must not arrive: malformed v1"},
		{"v2 with an unknown family", badFamily, "must not arrive: bad family"},
		{"v2 cut short by the client", v2[:20], ""},
	} {
		payload := c.payload
		got, el := send(c.prefix, payload)
		if got != "" {
			t.Errorf("%s: answered %q", c.name, got)
		}
		if _, ok := seen.Load(payload); ok && payload != "" {
			t.Errorf("%s: the backend received the payload", c.name)
		}
		if el > time.Second { // well before proxy_timeout: nothing to wait for
			t.Errorf("%s: closed after %v; want at once", c.name, el)
		}
	}
	// A trusted client that sends nothing is closed at proxy_timeout.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.ReadAll(c)
	c.Close()
	if el := time.Since(start); el < 1800*time.Millisecond || el > 4*time.Second {
		t.Errorf("a silent trusted client was closed after %v; want proxy_timeout (2s)", el)
	}
}

// TestAccessControl: a denied source is closed within 10 ms and the backend
// sees no connection; deny wins over allow.
func TestAccessControl(t *testing.T) {
	testkit.CheckLeaks(t)
	var conns atomic.Int64
	be1 := testkit.NewServer(t, func(c *net.TCPConn) { conns.Add(1); testkit.Greeter("a")(c) })
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"},
		extra:    "allow = [\"127.0.0.0/24\", \"::1\"]\ndeny = [\"127.0.0.66\"]",
		backends: []be{{"a", be1.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
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
	if n := r.ptr.Load().Services[0].Group.Rejected()[backend.RejectDenied]; n != 2 {
		t.Errorf("denied count = %d; want 2", n)
	}
	r.logs.Wait(t, time.Second, "rejection log", testkit.Message("connection rejected"))
}

// busy scales a tight timing bound on this shared 2-core machine under the
// race detector; 1 where nothing slows the process down.
func busy() time.Duration {
	if raceEnabled {
		return 5
	}
	return 1
}

// TestSourceLimit: with max_conns_per_source = 10, exactly 10 of 20
// connections from one source are served.
func TestSourceLimit(t *testing.T) {
	testkit.CheckLeaks(t)
	be1 := testkit.NewServer(t, testkit.Greeter("a"))
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: "max_conns_per_source = 10",
		backends: []be{{"a", be1.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
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

// TestAcceptRate: accept_rate = 5 with a burst of 5 lets 5 of 20 connections
// made at once through, and refuses the rest at once.
func TestAcceptRate(t *testing.T) {
	testkit.CheckLeaks(t)
	be1 := testkit.NewServer(t, testkit.Greeter("a"))
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: "accept_rate = 5\naccept_burst = 5",
		backends: []be{{"a", be1.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
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
	if n := r.ptr.Load().Services[0].Group.Rejected()[backend.RejectRate]; int(n) != 20-served {
		t.Errorf("rate rejections = %d; want %d", n, 20-served)
	}
}
