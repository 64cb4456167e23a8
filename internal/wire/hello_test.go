package wire

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"fulcrum/internal/testkit"
)

// FuzzClientHello feeds each input, as the first bytes of a client, to the
// framing (HelloLen) and the parser (ParseHello) that listener's preread uses. It
// never panics; a refusal is a *Error; a hello found whole is found
// at the same length whatever follows it, and no prefix of it was taken
// for a whole one (so a peek never decides early); a parsed server name is
// lowercase printable ASCII and every protocol name is non-empty.
//
//	go test -run '^$' -fuzz '^FuzzClientHello$' -fuzztime 30s ./internal/wire/
func FuzzClientHello(f *testing.F) {
	for _, cfg := range []*tls.Config{
		{ServerName: "db1.example.com"},
		{ServerName: "a.tenants.example.com", NextProtos: []string{"postgresql"}},
		{ServerName: "127.0.0.1", NextProtos: []string{"h2", "http/1.1"}},
		{ServerName: "x.example", MaxVersion: tls.VersionTLS12},
	} {
		h := testkit.ClientHello(f, cfg)
		f.Add(h)
		f.Add(testkit.Reframe(h, 64))
	}
	f.Add([]byte{recordHandshake, 3, 1, 0x40, 0, typeClientHello, 0, 0x40, 0})
	f.Add([]byte{recordHandshake, 3, 1, 0, 4, typeClientHello, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := HelloLen(data)
		var pe *Error
		if err != nil {
			if !errors.As(err, &pe) {
				t.Fatalf("HelloLen error %T %v; want a *Error", err, err)
			}
			return
		}
		if n == 0 {
			return // more bytes needed
		}
		if n > len(data) || n > MaxHello {
			t.Fatalf("HelloLen = %d of %d bytes", n, len(data))
		}
		if m, err := HelloLen(append(data[:n:n], 0x16, 3, 3)); m != n || err != nil {
			t.Fatalf("HelloLen with more bytes = %d, %v; want %d", m, err, n)
		}
		for _, k := range []int{n - 1, n / 2, recordHeader} {
			if k >= 0 && k < n {
				if m, err := HelloLen(data[:k]); m != 0 {
					t.Fatalf("HelloLen of a %d-byte prefix = %d, %v; want 0", k, m, err)
				}
			}
		}
		h, err := ParseHello(data[:n])
		if err != nil {
			if !errors.As(err, &pe) || pe.Reason != ReasonMalformed {
				t.Fatalf("ParseHello error %v; want %s", err, ReasonMalformed)
			}
			return
		}
		if h.Len != n {
			t.Fatalf("Len = %d; want %d", h.Len, n)
		}
		if h.SNI != strings.ToLower(h.SNI) || strings.ContainsFunc(h.SNI, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			t.Fatalf("SNI %q is not lowercase printable ASCII", h.SNI)
		}
		for _, p := range h.ALPN {
			if p == "" {
				t.Fatalf("empty ALPN protocol in %q", h.ALPN)
			}
		}
	})
}

// TestParseHelloAllocs: parsing copies out the name and the protocols
// only.
func TestParseHelloAllocs(t *testing.T) {
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com", NextProtos: []string{"h2", "http/1.1"}})
	n := testing.AllocsPerRun(100, func() {
		if _, err := ParseHello(hello); err != nil {
			t.Fatal(err)
		}
	})
	if n > 3 {
		t.Errorf("ParseHello allocates %v times; want at most 3", n)
	}
}
