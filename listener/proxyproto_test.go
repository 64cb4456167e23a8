package listener

import (
	"net"
	"testing"
	"time"

	"fulcrum/internal/sockfd"
	"fulcrum/internal/wire"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// TestSpoofedSplitSignature: from an untrusted source, a first read that is
// a prefix of a PROXY signature and is not completed within the timeout is
// refused — it cannot be let through on the chance that the rest comes
// later, as "P", a pause, then "ROXY …" did. A client that sends nothing
// (a server-first protocol) or that starts otherwise passes.
func TestSpoofedSplitSignature(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name  string
		parts []string // the first is sent; the rest would come after the timeout
		want  bool
	}{
		{"nothing", nil, false},
		{"P, then the rest too late", []string{"P", "ROXY TCP4 6.6.6.6 127.0.0.1 1 2\r\n"}, true},
		{"PROXY without its space", []string{"PROXY"}, true},
		{"11 bytes of the v2 signature", []string{wire.V2Sig[:11]}, true},
		{"whole v1 signature", []string{"PROXY TCP4 6.6.6.6 127.0.0.1 1 2\r\n"}, true},
		{"PING", []string{"PING\r\n"}, false},
		{"P, then I in time", []string{"PI"}, false},
	}
	loops := newTestLoop(t) // the first wait is in an event loop, as a Server's is
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := tcpPair(t)
			if len(tt.parts) > 0 {
				if _, err := c.Write([]byte(tt.parts[0])); err != nil {
					t.Fatal(err)
				}
			}
			fd := dupFD(s)
			defer sockfd.Close(fd)
			start := time.Now()
			got, err := spoofed(fd, timeout, loops)
			if err != nil {
				t.Fatalf("spoofed = %v, %v", got, err)
			}
			if got != tt.want {
				t.Errorf("spoofed = %v; want %v", got, tt.want)
			}
			if d := time.Since(start); d > timeout+time.Second {
				t.Errorf("spoofed took %v; want it bounded by the timeout %v", d, timeout)
			}
		})
	}
}
