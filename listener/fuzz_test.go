package listener

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"fulcrum/internal/testkit"
	"fulcrum/internal/wire"
)

// FuzzProxyHeader sends each input, as a client trusted to send a PROXY
// header, through a real proxy to a recording backend. It never panics; a
// connection whose header is refused never reaches the backend (not one
// byte); one whose header is accepted delivers exactly what follows it.
//
//	go test -run '^$' -fuzz '^FuzzProxyHeader$' -fuzztime 30s ./listener/
func FuzzProxyHeader(f *testing.F) {
	src := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4242}
	dst := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5432}
	v1, _ := proxyproto.HeaderProxyFromAddrs(1, src, dst).Format()
	v2, _ := proxyproto.HeaderProxyFromAddrs(2, src, dst).Format()
	v26, _ := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}, &net.TCPAddr{IP: net.ParseIP("2001:db8::2"), Port: 2}).Format()
	local, _ := (&proxyproto.Header{Version: 2, Command: proxyproto.LOCAL}).Format()
	for _, seed := range [][]byte{v1, v2, v26, local, append(v2, "hello"...), append(v1, "hello"...), []byte("PROXY UNKNOWN\r\nx"),
		[]byte("GET / HTTP/1.0\r\n\r\n"), v2[:13], []byte("PROXY TCP4 1.1.1.1 2.2.2.2 1 2\n")} {
		f.Add(seed)
	}

	var mu sync.Mutex // protects got
	var got [][]byte  // what each backend connection received, in order
	be := testkit.NewServer(f, func(c *net.TCPConn) {
		b, _ := io.ReadAll(testkit.User(c))
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
	})
	p := startProxy(f, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) {
		s.AcceptProxy = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		s.ProxyTimeout = time.Second
	}, 0)

	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		before := len(got)
		mu.Unlock()
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(data)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // ends when the proxy has closed both sides

		// What the proxy should have decided, from the same header rules.
		n, herr := wire.HeaderLen(data)
		accepted := herr == nil && n > 0
		if accepted {
			_, perr := wire.ParseHeader(data[:n])
			accepted = perr == nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !accepted && len(got) != before:
			t.Fatalf("refused header %q, yet the backend got a connection carrying %q", data, got[len(got)-1])
		case accepted && len(got) != before+1:
			t.Fatalf("accepted header %q, yet the backend got %d connections", data[:n], len(got)-before)
		case accepted && string(got[before]) != string(data[n:]):
			t.Fatalf("after header %q the backend got %q; want %q", data[:n], got[before], data[n:])
		}
	})
}
