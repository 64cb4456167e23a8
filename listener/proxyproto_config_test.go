package listener_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
	"fulcrum/listener"
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
	p := proxy.Start(t, fmt.Sprintf(`
[services.one]
listen = ["127.0.0.1:0", "[::1]:0"]
scheduler = "rr"
drain_timeout = "3s"
proxy_protocol = "v1"
backends = [{ name = "a", address = %q }]

[services.two]
listen = [%q, %q]
scheduler = "rr"
drain_timeout = "3s"
proxy_protocol = "none"
# a backend overrides its service
backends = [{ name = "b", address = %q, proxy_protocol = "v2" }]
`, v1.Addr, testkit.FreeAddr(t), free6(t), v2.Addr))
	two := p.Snapshot().Services[1].Listen[0].String()
	two6 := p.Snapshot().Services[1].Listen[1].String()
	cases := []struct {
		from, to, version string
	}{
		{"127.0.0.5", p.Addr(t, "127.0.0.1:0"), "v1"},
		{"::1", p.Addr(t, "[::1]:0"), "v1"},
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
	var bs []string // inline backend tables
	for _, n := range []string{"a", "b", "c", "d"} {
		bs = append(bs, fmt.Sprintf("{ name = %q, address = %q }", n, testkit.NewServer(t, testkit.Greeter(n)).Addr))
	}
	inner := testkit.FreeAddr(t)
	p := proxy.Start(t, fmt.Sprintf(`
[services.outer]
listen = ["127.0.0.1:0"]
scheduler = "rr"
drain_timeout = "3s"
proxy_protocol = "v2"
backends = [{ name = "inner", address = %q }]

[services.inner]
listen = [%q]
scheduler = "sh"
drain_timeout = "3s"
accept_proxy = ["127.0.0.1/32"]
backends = [%s]
`, inner, inner, strings.Join(bs, ", ")))
	outer := p.Addr(t, "127.0.0.1:0")
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
	line := p.Logs.Wait(t, 5*time.Second, "inner access", func(m map[string]any) bool {
		return m["message"] == "connection" && m["service"] == "inner" && strings.HasPrefix(fmt.Sprint(m["client"]), "127.0.2.")
	})
	if line["client"] == "127.0.0.1" {
		t.Errorf("the inner logged the outer's address")
	}

	// A client trying to claim another address by talking PROXY to the
	// inner directly (it is not 127.0.0.1) is refused before any dial.
	total := uint64(0)
	for _, b := range p.Snapshot().Services[1].Targets {
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
	for _, b := range p.Snapshot().Services[1].Targets {
		after += b.B.Stats().Total
	}
	if len(got) != 0 || after != total {
		t.Errorf("a spoofed header got %q and %d backend connections; want refused", got, after-total)
	}
	if n := p.Admission(p.Snapshot().Services[1].Name).Rejected[listener.RejectProxy.String()]; n != 1 {
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
	p := proxy.Start(t, fmt.Sprintf(`
[services.s]
listen = ["127.0.0.1:0"]
scheduler = "rr"
drain_timeout = "3s"
accept_proxy = ["127.0.0.0/8"]
proxy_timeout = "2s"
backends = [{ name = "a", address = %q }]
`, echo.Addr))
	addr := p.Addr(t, "127.0.0.1:0")
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
