package reload

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
)

// instance is one Manager and its Server, applied a configuration.
type instance struct {
	h    *harness
	logs *testkit.LogSink
}

func startInstance(t *testing.T, text string, adopt []listener.Exported) *instance {
	t.Helper()
	in := &instance{h: &harness{t: t}, logs: testkit.NewLogSink()}
	log := zerolog.New(in.logs)
	in.h.srv = listener.New(log)
	for _, e := range adopt {
		l, err := net.FileListener(e.File)
		e.File.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := in.h.srv.Adopt(e.Key, l.(*net.TCPListener)); err != nil {
			t.Fatal(err)
		}
	}
	in.h.m = New("", in.h.srv, log, Options{})
	t.Cleanup(func() { in.h.m.Shutdown(context.Background()) })
	cfg, err := conf.Parse("t.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.h.m.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	in.h.srv.CloseUnadopted()
	return in
}

// wantAccepts says how many connections in has accepted, unless it is n:
// a listener's accept gives the test no event.
func wantAccepts(what string, in *instance, n uint64) error {
	if got := in.accepts(); got != n {
		return fmt.Errorf("%s accepted %d connections; want %d", what, got, n)
	}
	return nil
}

func (in *instance) accepts() uint64 {
	var n uint64
	for _, s := range in.h.srv.Sockets() {
		n += s.Accepts
	}
	return n
}

// clientHello returns the first flight of a TLS client asking for name.
func clientHello(t *testing.T, name string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() { // exits when a is closed
		tls.Client(b, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
		b.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(a, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(a, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// testServedWhileStopping: a client connects and sends the first part of
// what its listener reads before picking a backend (a PROXY header, a
// ClientHello); the instance then stops (Shutdown), or hands its listening
// sockets to a new instance and stops, while the connection waits there;
// then the client sends the rest. The connection was accepted before the
// listeners closed: it must be dialled and proxied byte-exact, then
// drained, not refused with end=no backend. The backend echoes; echoed is
// what it sees of first and rest.
func testServedWhileStopping(t *testing.T, extra string, first, rest, echoed []byte, handOver bool) {
	be := testkit.NewServer(t, testkit.Echo)
	text := fmt.Sprintf("[services.s]\nlisten = [\"127.0.0.1:0\"]\ndrain_timeout = \"20s\"\n%s\n[[services.s.backends]]\naddress = %q\n", extra, be.Addr)
	old := startInstance(t, text, nil)
	addr := old.h.srv.Addr(netip.MustParseAddrPort("127.0.0.1:0")).String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, func() error { return wantAccepts("the old instance", old, 1) })
	var next *instance
	if handOver {
		exp, err := old.h.srv.Export()
		if err != nil {
			t.Fatal(err)
		}
		next = startInstance(t, text, exp)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- old.h.m.Shutdown(context.Background()) }() // returns once the session has ended
	// Shutdown has closed the listeners and begun every drain: the drain
	// is listed, waiting for the admission, or (the old code) the backend
	// takes no new connection, from the start of its drain.
	b := old.h.srv.Snapshot().Services[0].Targets[0].B
	testkit.WaitFor(t, 10*time.Second, func() error {
		if s, d := len(old.h.srv.Sockets()), len(old.h.m.Draining()); s != 0 || (d != 1 && !b.Draining()) {
			return fmt.Errorf("after Shutdown: %d sockets, %d drains listed, backend draining %v; want no socket and the backend draining", s, d, b.Draining())
		}
		return nil
	})
	if handOver { // a connection made now is the new instance's
		d, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("after the hand-over: %v", err)
		}
		d.Close()
		testkit.WaitFor(t, 10*time.Second, func() error { return wantAccepts("the new instance", next, 1) })
	}
	payload := bytes.Repeat([]byte("fulcrum drains what it accepted. "), 4096)
	go func() { // exits when the writes are done or fail
		c.Write(rest)
		c.Write(payload)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	want := append(bytes.Clone(echoed), payload...)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("the connection accepted before Shutdown: read %d bytes (err %v), byte-exact %v; want %d bytes echoed\nthe old instance's log: %v",
			len(got), err, bytes.Equal(got, want), len(want), old.logs.All(func(map[string]any) bool { return true }))
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return within 20s of its last session's end")
	}
}

const proxyExtra = "accept_proxy = [\"127.0.0.0/8\"]\nproxy_timeout = \"30s\""

var proxyHeader = []byte("PROXY TCP4 127.0.0.9 127.0.0.1 40000 5432\r\n")

func TestShutdownServesPROXYHeaderInFlight(t *testing.T) {
	n := len(proxyHeader) - 5
	testServedWhileStopping(t, proxyExtra, proxyHeader[:n], proxyHeader[n:], nil, false)
}

func TestHandOverServesPROXYHeaderInFlight(t *testing.T) {
	n := len(proxyHeader) - 5
	testServedWhileStopping(t, proxyExtra, proxyHeader[:n], proxyHeader[n:], nil, true)
}

const sniExtra = "sni = [\"db.example.com\"]\npreread_timeout = \"30s\""

func TestShutdownServesClientHelloInFlight(t *testing.T) {
	h := clientHello(t, "db.example.com")
	testServedWhileStopping(t, sniExtra, h[:10], h[10:], h, false)
}

func TestHandOverServesClientHelloInFlight(t *testing.T) {
	h := clientHello(t, "db.example.com")
	testServedWhileStopping(t, sniExtra, h[:10], h[10:], h, true)
}
