package testkit

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// ClientHello returns the ClientHello record crypto/tls sends with cfg, for
// tests of what reads it (internal/wire, listener's preread).
func ClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { // exits when b is closed under the handshake
		defer close(done)
		tls.Client(a, cfg).Handshake()
		a.Close()
	}()
	defer func() { b.Close(); <-done }()
	var hdr [5]byte // content type, version, length
	if _, err := io.ReadFull(b, hdr[:]); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, len(hdr)+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr[:])
	if _, err := io.ReadFull(b, rec[len(hdr):]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Reframe splits the handshake message of the one TLS record in rec into
// records carrying at most size bytes each, as a client may.
func Reframe(rec []byte, size int) []byte {
	msg := rec[5:]
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, rec[0], rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}
