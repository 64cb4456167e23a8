package wire

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	proxyproto "github.com/pires/go-proxyproto"
)

// headers are a v1, a v2 over IPv4 and over IPv6, and a v2 LOCAL header.
func headers(t testing.TB) [][]byte {
	src := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4242}
	dst := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5432}
	var out [][]byte
	for _, h := range []*proxyproto.Header{
		proxyproto.HeaderProxyFromAddrs(1, src, dst),
		proxyproto.HeaderProxyFromAddrs(2, src, dst),
		proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}, &net.TCPAddr{IP: net.ParseIP("2001:db8::2"), Port: 2}),
		{Version: 2, Command: proxyproto.LOCAL},
	} {
		b, err := h.Format()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestHeaderLen: a header is framed at its length whatever follows it,
// every prefix of it asks for more, and what cannot start one is refused
// with its reason.
func TestHeaderLen(t *testing.T) {
	for _, h := range headers(t) {
		if n, err := HeaderLen(append(h[:len(h):len(h)], "hello"...)); n != len(h) || err != nil {
			t.Errorf("HeaderLen(%q + hello) = %d, %v; want %d", h, n, err, len(h))
		}
		for k := range len(h) {
			if n, err := HeaderLen(h[:k]); n != 0 || err != nil {
				t.Errorf("HeaderLen of the first %d bytes of %q = %d, %v; want 0, nil", k, h, n, err)
			}
		}
	}
	big := []byte(V2Sig + "\x21\x11\xff\xff")
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"GET / HTTP/1.0\r\n", ErrNoHeader},
		{"PROXY TCP4 " + strings.Repeat("1", MaxV1Header), ErrBadHeader},
		{string(big), ErrBigHeader},
	} {
		if _, err := HeaderLen([]byte(tc.in)); !errors.Is(err, tc.want) {
			t.Errorf("HeaderLen(%.20q) = %v; want %v", tc.in, err, tc.want)
		}
	}
}

// TestHeaderRoundTrip: what WriteHeader writes, ParseHeader and Addrs read
// back; a LOCAL header carries none.
func TestHeaderRoundTrip(t *testing.T) {
	src := netip.MustParseAddrPort("192.0.2.1:4242")
	dst := netip.MustParseAddrPort("192.0.2.2:5432")
	for _, v := range []int{1, 2} {
		var b strings.Builder
		if err := WriteHeader(&b, v, src, dst); err != nil {
			t.Fatal(err)
		}
		h, err := ParseHeader([]byte(b.String()))
		if err != nil {
			t.Fatalf("v%d: ParseHeader(%q) = %v", v, b.String(), err)
		}
		s, d, ok := Addrs(h)
		if want := netip.AddrPortFrom(src.Addr().Unmap(), 4242); !ok || s != want || d != dst {
			t.Errorf("v%d: Addrs = %v, %v, %v; want %v, %v", v, s, d, ok, netip.AddrPortFrom(src.Addr().Unmap(), 4242), dst)
		}
	}
	local := headers(t)[3]
	h, err := ParseHeader(local)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := Addrs(h); ok {
		t.Errorf("Addrs of a LOCAL header: ok; want none")
	}
}

// TestSignatureStart: a prefix of either signature matches and waits for
// more; a whole signature, or anything else, is decided.
func TestSignatureStart(t *testing.T) {
	for _, tc := range []struct {
		in             string
		match, decided bool
	}{
		{"P", true, false},
		{"PROXY", true, false},
		{"PROXY ", true, true},
		{V2Sig[:11], true, false},
		{V2Sig, true, true},
		{"PI", false, true},
		{"GET /", false, true},
	} {
		if m, d := SignatureStart([]byte(tc.in)); m != tc.match || d != tc.decided {
			t.Errorf("SignatureStart(%q) = %v, %v; want %v, %v", tc.in, m, d, tc.match, tc.decided)
		}
	}
}

// FuzzHeader feeds each input, as a trusted balancer's first bytes, to the
// framing (HeaderLen) and the parser (ParseHeader) that listener's
// readHeader uses. It never panics; a header framed whole is framed at the
// same length whatever follows it, and no prefix of it was taken for a
// whole one (so a peek never decides early). The whole path, through a
// proxy, is listener's FuzzProxyHeader.
//
//	go test -run '^$' -fuzz '^FuzzHeader$' -fuzztime 30s ./internal/wire/
func FuzzHeader(f *testing.F) {
	for _, h := range headers(f) {
		f.Add(h)
		f.Add(append(h[:len(h):len(h)], "hello"...))
	}
	f.Add([]byte("PROXY UNKNOWN\r\nx"))
	f.Add([]byte("PROXY TCP4 1.1.1.1 2.2.2.2 1 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := HeaderLen(data)
		if err != nil || n == 0 {
			return
		}
		if n > len(data) || n > MaxV2Header {
			t.Fatalf("HeaderLen = %d of %d bytes", n, len(data))
		}
		if m, err := HeaderLen(append(data[:n:n], "\r\nPROXY"...)); m != n || err != nil {
			t.Fatalf("HeaderLen with more bytes = %d, %v; want %d", m, err, n)
		}
		for _, k := range []int{n - 1, n / 2} {
			if m, _ := HeaderLen(data[:k]); m != 0 {
				t.Fatalf("HeaderLen of a %d-byte prefix = %d; want 0", k, m)
			}
		}
		if h, err := ParseHeader(data[:n]); err == nil {
			Addrs(h)
		} else if !errors.Is(err, ErrBadHeader) {
			t.Fatalf("ParseHeader error %v; want one wrapping ErrBadHeader", err)
		}
	})
}
