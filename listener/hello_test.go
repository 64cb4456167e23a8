package listener

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/sockfd"
	"fulcrum/internal/testkit"
	"fulcrum/internal/wire"

	"golang.org/x/sys/unix"
)

// The TLS values the tests write by hand.
const (
	recordHeader    = 5  // content type, version, length
	recordHandshake = 22 // content type of handshake records
	typeClientHello = 1
	hostName        = 0 // server_name name_type
)

type prereadResult struct {
	h   wire.Hello
	err error
	c   *net.TCPConn // the accepted connection, still open
	dur time.Duration
}

// testLoop is one event loop as preread's loopSource.
type testLoop struct{ lp *loop }

func (l testLoop) loop() (*loop, error) { return l.lp, nil }

// waiting reports whether a goroutine awaits a socket in the loop.
func (l testLoop) waiting() bool {
	for i := range l.lp.wait {
		if l.lp.wait[i].Load() != nil {
			return true
		}
	}
	return false
}

// newTestLoop starts an event loop that the test's cleanup stops.
func newTestLoop(t *testing.T) testLoop {
	t.Helper()
	lp, err := newLoop()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lp.close)
	return testLoop{lp}
}

// prereadOne listens on 127.0.0.1, runs preread on the first connection it
// accepts, waiting in an event loop as a Server's does, and sends the
// result; the test's cleanup closes both.
func prereadOne(t *testing.T, timeout time.Duration) (string, <-chan prereadResult) {
	t.Helper()
	return prereadOneIn(t, timeout, newTestLoop(t))
}

// prereadOneIn is prereadOne waiting in loops' event loops, or in Go's
// poller if loops is nil.
func prereadOneIn(t *testing.T, timeout time.Duration, loops loopSource) (string, <-chan prereadResult) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan prereadResult, 1)
	done := make(chan struct{})
	go func() { // exits after one accept, or when ln is closed
		defer close(done)
		c, err := ln.AcceptTCP()
		if err != nil {
			ch <- prereadResult{err: err}
			return
		}
		start := time.Now()
		fd := dupFD(c) // fulcrum reads its clients as raw descriptors
		h, err := preread(fd, timeout, loops)
		sockfd.Close(fd)
		ch <- prereadResult{h: h, err: err, c: c, dur: time.Since(start)}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		select {
		case r := <-ch:
			if r.c != nil {
				r.c.Close()
			}
		default:
		}
	})
	return ln.Addr().String(), ch
}

// wait receives the result, giving it back for the cleanup to close.
func wait(t *testing.T, ch <-chan prereadResult) prereadResult {
	t.Helper()
	select {
	case r := <-ch:
		t.Cleanup(func() {
			if r.c != nil {
				r.c.Close()
			}
		})
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("preread did not return")
	}
	return prereadResult{}
}

// dupFD returns a duplicate of c's descriptor, non-blocking like c's, for
// the caller to close.
func dupFD(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(s uintptr) { fd, _ = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	return fd
}

func dialTCP(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// TestPrereadTLS: a crypto/tls client's server name and protocols are read
// without consuming a byte: a TLS server then completes the handshake on
// the same socket, with the protocol the client offered.
func TestPrereadTLS(t *testing.T) {
	testkit.CheckLeaks(t)
	ca := testkit.NewCA(t)
	cert := ca.Issue(t, "db1.example.com", "*.tenants.example.com")
	for _, tc := range []struct {
		name, server, wantSNI string
		alpn                  []string
	}{
		{"sni", "db1.example.com", "db1.example.com", nil},
		{"upper case", "DB1.Example.com", "db1.example.com", nil},
		{"wildcard cert", "a.tenants.example.com", "a.tenants.example.com", []string{"postgresql"}},
		{"alpn", "db1.example.com", "db1.example.com", []string{"h2", "http/1.1"}},
		{"no sni", "127.0.0.1", "", []string{"h2"}}, // crypto/tls sends no SNI for an address
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, ch := prereadOne(t, 5*time.Second)
			c := dialTCP(t, addr)
			cfg := &tls.Config{ServerName: tc.server, RootCAs: ca.Pool, NextProtos: tc.alpn}
			tc1 := tls.Client(c, cfg)
			errc := make(chan error, 1)
			go func() { errc <- tc1.Handshake() }() // exits when the handshake ends or c closes
			r := wait(t, ch)
			if r.err != nil {
				t.Fatalf("preread: %v", r.err)
			}
			if r.h.Proto != wire.ProtoTLS || r.h.SNI != tc.wantSNI || strings.Join(r.h.ALPN, ",") != strings.Join(tc.alpn, ",") {
				t.Fatalf("preread = %+v; want tls, SNI %q, ALPN %q", r.h, tc.wantSNI, tc.alpn)
			}
			srv := tls.Server(r.c, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1", "postgresql"}})
			if err := srv.Handshake(); err != nil {
				t.Fatalf("the server's handshake after the preread: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("the client's handshake: %v", err)
			}
			if len(tc.alpn) > 0 && srv.ConnectionState().NegotiatedProtocol != tc.alpn[0] {
				t.Errorf("negotiated %q; want %q", srv.ConnectionState().NegotiatedProtocol, tc.alpn[0])
			}
		})
	}
}

// TestPrereadFragmented: a hello written one byte per segment (TCP_NODELAY),
// and a hello spread over many small records, are both read whole.
func TestPrereadFragmented(t *testing.T) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db2.example.com", NextProtos: []string{"postgresql"}})
	for _, tc := range []struct {
		name  string
		bytes []byte
	}{
		{"one record", hello},
		{"7-byte records", testkit.Reframe(hello, 7)},
		{"1-byte records", testkit.Reframe(hello, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, ch := prereadOne(t, 20*time.Second)
			c := dialTCP(t, addr)
			c.SetNoDelay(true)
			for i := range tc.bytes {
				if _, err := c.Write(tc.bytes[i : i+1]); err != nil {
					t.Fatal(err)
				}
			}
			r := wait(t, ch)
			if r.err != nil {
				t.Fatalf("preread: %v", r.err)
			}
			if r.h.SNI != "db2.example.com" || len(r.h.ALPN) != 1 || r.h.ALPN[0] != "postgresql" || r.h.Len != len(tc.bytes) {
				t.Fatalf("preread = %+v; want SNI db2.example.com, ALPN postgresql, %d bytes", r.h, len(tc.bytes))
			}
			got := make([]byte, len(tc.bytes)) // every byte is still there
			if _, err := io.ReadFull(r.c, got); err != nil || !bytes.Equal(got, tc.bytes) {
				t.Fatalf("after the preread the socket holds %x, %v; want the hello", got, err)
			}
		})
	}
}

// TestPrereadStopsMidHello: a client that stops inside its hello is
// refused at the timeout; one that closes inside it, at once.
func TestPrereadStopsMidHello(t *testing.T) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com"})
	for _, cut := range []int{1, 4, recordHeader + 10, len(hello) - 1} {
		addr, ch := prereadOne(t, 300*time.Millisecond)
		c := dialTCP(t, addr)
		c.Write(hello[:cut])
		r := wait(t, ch)
		var pe *wire.Error
		if !errors.As(r.err, &pe) || pe.Reason != wire.ReasonTimeout || !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Errorf("after %d bytes: preread = %+v, %v; want %s", cut, r.h, r.err, wire.ReasonTimeout)
		}
		if r.dur < 300*time.Millisecond {
			t.Errorf("after %d bytes: refused after %v, before the timeout", cut, r.dur)
		}

		addr, ch = prereadOne(t, 20*time.Second)
		c = dialTCP(t, addr)
		c.Write(hello[:cut])
		c.CloseWrite()
		r = wait(t, ch)
		if !errors.As(r.err, &pe) || pe.Reason != wire.ReasonClosed {
			t.Errorf("after %d bytes and FIN: preread = %+v, %v; want %s", cut, r.h, r.err, wire.ReasonClosed)
		}
		if r.dur > 10*time.Second {
			t.Errorf("after %d bytes and FIN: refused after %v; want at once", cut, r.dur)
		}
	}
}

// TestPrereadNotTLS: other protocols, a GSSENCRequest, a StartupMessage and
// a silent client are not TLS, and nothing of theirs is consumed.
func TestPrereadNotTLS(t *testing.T) {
	testkit.CheckLeaks(t)
	startup := []byte{0, 0, 0, 0x29, 0, 3, 0, 0}
	startup = append(startup, "user\x00postgres\x00database\x00postgres\x00\x00"...)
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"startup", startup},
		{"gssenc", []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30}},
		{"sslv2", []byte{0x80, 0x2e, 0x01, 0x03, 0x01}},
		{"silent", nil},
	} {
		for _, inLoop := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/loop=%v", tc.name, inLoop), func(t *testing.T) {
				var loops loopSource
				if inLoop {
					loops = newTestLoop(t)
				}
				addr, ch := prereadOneIn(t, 200*time.Millisecond, loops)
				c := dialTCP(t, addr)
				c.Write(tc.first)
				r := wait(t, ch)
				if r.err != nil || r.h.Proto != wire.ProtoNone || r.h.SNI != "" {
					t.Fatalf("preread = %+v, %v; want not TLS", r.h, r.err)
				}
				got := make([]byte, len(tc.first))
				if _, err := io.ReadFull(r.c, got); err != nil || !bytes.Equal(got, tc.first) {
					t.Fatalf("after the preread the socket holds %q, %v; want %q", got, err, tc.first)
				}
			})
		}
	}
}

// TestPrereadWaitsInLoop: a client that sends its hello, or its
// SSLRequest and then its hello, only once preread waits for it wakes
// preread through the event loop, which holds no waiter afterwards; a
// client that closes while preread waits is refused as closed.
func TestPrereadWaitsInLoop(t *testing.T) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com", NextProtos: []string{"postgresql"}})
	untilWaiting := func(l testLoop) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, func() error { // nothing to await: poll
			if !l.waiting() {
				return errors.New("preread is not waiting in the loop")
			}
			return nil
		})
	}
	for _, tc := range []struct {
		name string
		ssl  bool
	}{{"tls", false}, {"postgres", true}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLoop(t)
			addr, ch := prereadOneIn(t, 20*time.Second, l)
			c := dialTCP(t, addr)
			if tc.ssl {
				untilWaiting(l)
				c.Write(wire.SSLRequest[:])
				var ans [1]byte
				if _, err := io.ReadFull(c, ans[:]); err != nil || ans[0] != 'S' {
					t.Fatalf("answer to SSLRequest: %q, %v; want S", ans, err)
				}
			}
			untilWaiting(l)
			c.Write(hello)
			r := wait(t, ch)
			want := wire.ProtoTLS
			if tc.ssl {
				want = wire.ProtoPostgres
			}
			if r.err != nil || r.h.Proto != want || r.h.SNI != "db1.example.com" || r.h.Len != len(hello) {
				t.Fatalf("preread = %+v, %v; want %v for db1.example.com, %d bytes", r.h, r.err, want, len(hello))
			}
			if l.waiting() {
				t.Error("a waiter is left in the loop")
			}
		})
	}
	t.Run("close", func(t *testing.T) {
		l := newTestLoop(t)
		addr, ch := prereadOneIn(t, 20*time.Second, l)
		c := dialTCP(t, addr)
		untilWaiting(l)
		c.Close()
		r := wait(t, ch)
		var pe *wire.Error
		if !errors.As(r.err, &pe) || pe.Reason != wire.ReasonClosed || r.dur > 10*time.Second {
			t.Fatalf("preread = %+v, %v after %v; want %s at once", r.h, r.err, r.dur, wire.ReasonClosed)
		}
	})
}

// TestPrereadRefused: oversized and malformed hellos are refused with
// their reason, without waiting for more bytes.
func TestPrereadRefused(t *testing.T) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com", NextProtos: []string{"h2"}})
	big := []byte{recordHandshake, 3, 1, 0x40, 0, typeClientHello, 0, 0x40, 0} // 16 KiB of hello announced
	bigSplit := testkit.Reframe(append([]byte{recordHandshake, 3, 1, 0x3f, 0xfc, typeClientHello, 0, 0x3f, 0xf8}, make([]byte, 0x3ff8)...), 1000)
	serverHello := append([]byte(nil), hello...)
	serverHello[recordHeader] = 2
	alert := append(testkit.Reframe(hello, 100)[:105:105], 21, 3, 1, 0, 2, 2, 40)
	withExt := func(ext []byte) []byte {
		// A minimal hello: version, random, no session, one suite, null
		// compression, then the given extensions.
		body := append([]byte{3, 3}, make([]byte, 32)...)
		body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0)
		body = append(body, byte(len(ext)>>8), byte(len(ext)))
		body = append(body, ext...)
		msg := append([]byte{typeClientHello, 0, byte(len(body) >> 8), byte(len(body))}, body...)
		return append([]byte{recordHandshake, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
	}
	sni := func(name string) []byte {
		e := []byte{0, 0, 0, byte(len(name) + 5), 0, byte(len(name) + 3), hostName, 0, byte(len(name))}
		return append(e, name...)
	}
	trailing := withExt(nil) // a byte after the message, inside its record
	trailing[4]++
	trailing = append(trailing, 0)
	for _, tc := range []struct {
		name   string
		bytes  []byte
		reason string
	}{
		{"announced 16 KiB", big, wire.ReasonTooLarge},
		{"over 16 KiB in records", bigSplit, wire.ReasonTooLarge},
		{"server hello", serverHello, wire.ReasonMalformed},
		{"alert inside", alert, wire.ReasonMalformed},
		{"record version", append([]byte{recordHandshake, 2, 0}, hello[3:]...), wire.ReasonMalformed},
		{"empty record", []byte{recordHandshake, 3, 1, 0, 0}, wire.ReasonMalformed},
		{"two server names", withExt(append(sni("a.example"), sni("b.example")...)), wire.ReasonMalformed},
		{"name with a space", withExt(sni("a b.example")), wire.ReasonMalformed},
		{"empty alpn name", withExt([]byte{0, 16, 0, 3, 0, 1, 0}), wire.ReasonMalformed},
		{"truncated extensions", withExt([]byte{0, 16, 0, 9, 0, 1}), wire.ReasonMalformed},
		{"trailing bytes", trailing, wire.ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, ch := prereadOne(t, 20*time.Second)
			c := dialTCP(t, addr)
			c.Write(tc.bytes)
			r := wait(t, ch)
			var pe *wire.Error
			if !errors.As(r.err, &pe) || pe.Reason != tc.reason {
				t.Fatalf("preread = %+v, %v; want %s", r.h, r.err, tc.reason)
			}
			if r.dur > 10*time.Second {
				t.Errorf("refused after %v; want at once", r.dur)
			}
		})
	}
	// The minimal hello itself is fine, with and without its name.
	for _, b := range [][]byte{withExt(nil), withExt(sni("A.Example"))} {
		if h, err := wire.ParseHello(b); err != nil {
			t.Errorf("wire.ParseHello(%x) = %v", b, err)
		} else if n, _ := wire.HelloLen(b); n != len(b) {
			t.Errorf("wire.HelloLen(%x) = %d; want %d", b, n, len(b))
		} else if len(b) > 60 && h.SNI != "a.example" {
			t.Errorf("SNI = %q; want a.example", h.SNI)
		}
	}
}

// TestPrereadSSLRequest: a PostgreSQL client's SSLRequest is answered 'S'
// and consumed; its ClientHello is then read like any other and left for
// the server, whose handshake completes.
func TestPrereadSSLRequest(t *testing.T) {
	testkit.CheckLeaks(t)
	ca := testkit.NewCA(t)
	cert := ca.Issue(t, "db1.example.com")
	addr, ch := prereadOne(t, 5*time.Second)
	c := dialTCP(t, addr)
	c.SetNoDelay(true)
	for i := range wire.SSLRequest { // in pieces, too
		c.Write(wire.SSLRequest[i : i+1])
	}
	var ans [1]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil || ans[0] != 'S' {
		t.Fatalf("answer to SSLRequest: %q, %v; want S", ans, err)
	}
	cl := tls.Client(c, &tls.Config{ServerName: "db1.example.com", RootCAs: ca.Pool, NextProtos: []string{"postgresql"}})
	errc := make(chan error, 1)
	go func() { errc <- cl.Handshake() }() // exits when the handshake ends or c closes
	r := wait(t, ch)
	if r.err != nil || r.h.Proto != wire.ProtoPostgres || r.h.SNI != "db1.example.com" {
		t.Fatalf("preread = %+v, %v; want postgres-tls for db1.example.com", r.h, r.err)
	}
	if err := tls.Server(r.c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake(); err != nil {
		t.Fatalf("the server's handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("the client's handshake: %v", err)
	}
}

// TestBackendSSL: towards a backend, an SSLRequest must be answered 'S';
// 'N', a close or silence is backend-no-ssl.
func TestBackendSSL(t *testing.T) {
	testkit.CheckLeaks(t)
	for _, tc := range []struct {
		name   string
		answer []byte
		ok     bool
	}{
		{"S", []byte("S"), true},
		{"N", []byte("N"), false},
		{"error message", []byte("E\x00\x00\x00\x10"), false},
		{"close", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			be := testkit.NewServer(t, func(c *net.TCPConn) {
				var b [8]byte
				io.ReadFull(c, b[:])
				got <- b[:]
				c.Write(tc.answer)
				if tc.answer != nil {
					io.Copy(io.Discard, testkit.User(c))
				}
			})
			fd := dupFD(dialTCP(t, be.Addr))
			err := backendSSL(fd, 5*time.Second)
			sockfd.Close(fd)
			var pe *wire.Error
			switch {
			case tc.ok && err != nil:
				t.Fatalf("backendSSL = %v; want nil", err)
			case !tc.ok && (!errors.As(err, &pe) || pe.Reason != wire.ReasonNoSSL):
				t.Fatalf("backendSSL = %v; want %s", err, wire.ReasonNoSSL)
			}
			if b := <-got; !bytes.Equal(b, wire.SSLRequest[:]) {
				t.Errorf("the backend got %x; want an SSLRequest", b)
			}
		})
	}
}
