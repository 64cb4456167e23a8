package wire

// The PROXY protocol (HAProxy's, v1 text and v2 binary), read from trusted
// balancers in front of fulcrum and written to backends behind it. Headers
// are parsed and formatted by github.com/pires/go-proxyproto; this file
// frames them, so that a reader can peek until a header is whole and then
// consume exactly its length.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"

	proxyproto "github.com/pires/go-proxyproto"
)

const (
	MaxV1Header = 107        // the longest v1 line, CRLF included
	MaxV2Header = 16 + 1<<12 // a v2 header with up to 4 KiB of addresses and TLVs
	v2Fixed     = 16         // signature, version/command, family, length
	V1Sig       = "PROXY "   // proxyproto.SIGV1 plus the space that follows it
	V2Sig       = "\r\n\r\n\x00\r\nQUIT\n"
)

var (
	ErrNoHeader  = errors.New("no PROXY header")
	ErrBadHeader = errors.New("malformed PROXY header")
	ErrBigHeader = errors.New("PROXY header too large")
)

// HeaderLen frames the PROXY header at the start of b. Returns: its
// length; 0 if more bytes are needed to tell; or ErrNoHeader (b starts
// otherwise), ErrBadHeader (a v1 line too long) or ErrBigHeader (a v2
// header over MaxV2Header).
func HeaderLen(b []byte) (int, error) {
	if n := min(len(b), len(V2Sig)); string(b[:n]) == V2Sig[:n] {
		if len(b) < v2Fixed {
			return 0, nil
		}
		total := v2Fixed + int(binary.BigEndian.Uint16(b[14:16]))
		if total > MaxV2Header {
			return 0, ErrBigHeader
		}
		if len(b) < total {
			return 0, nil
		}
		return total, nil
	}
	if n := min(len(b), len(V1Sig)); string(b[:n]) == V1Sig[:n] {
		if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
			if i+2 > MaxV1Header {
				return 0, ErrBadHeader
			}
			return i + 2, nil
		}
		if len(b) >= MaxV1Header {
			return 0, ErrBadHeader
		}
		return 0, nil
	}
	if len(b) == 0 {
		return 0, nil
	}
	return 0, ErrNoHeader
}

// ParseHeader parses a whole header (exactly b, as HeaderLen framed it)
// with go-proxyproto. Returns: the header, or an error wrapping
// ErrBadHeader.
func ParseHeader(b []byte) (*proxyproto.Header, error) {
	h, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(b), max(len(b), 16)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	return h, nil
}

// SignatureStart tells whether b, the first bytes of a client, begin a
// PROXY signature. Returns: match, true when b is (a prefix of) a header,
// even a malformed one; decided, true once b says no more (no signature,
// or a whole one).
func SignatureStart(b []byte) (match, decided bool) {
	_, herr := HeaderLen(b)
	match = herr == nil || errors.Is(herr, ErrBadHeader) || errors.Is(herr, ErrBigHeader)
	full := len(b) >= len(V1Sig) && string(b[:len(V1Sig)]) == V1Sig || len(b) >= len(V2Sig)
	return match, !match || full
}

// Addrs returns the client and original destination a header carries
// (IPv4-mapped addresses unmapped), or ok false for a LOCAL/UNKNOWN header
// (a balancer's own health check).
func Addrs(h *proxyproto.Header) (src, dst netip.AddrPort, ok bool) {
	s, sok := h.SourceAddr.(*net.TCPAddr)
	d, dok := h.DestinationAddr.(*net.TCPAddr)
	if h.Command.IsLocal() || !sok || !dok {
		return src, dst, false
	}
	src, dst = s.AddrPort(), d.AddrPort()
	return netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), true
}

// WriteHeader writes to w a PROXY header of version 1 or 2 for a
// connection from src to dst. Returns: w's error.
func WriteHeader(w io.Writer, version int, src, dst netip.AddrPort) error {
	if src.Addr().Is4() != dst.Addr().Is4() { // the protocol needs one family: keep the client's
		if src.Addr().Is4() {
			dst = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		} else {
			dst = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
	}
	h := proxyproto.HeaderProxyFromAddrs(byte(version), net.TCPAddrFromAddrPort(src), net.TCPAddrFromAddrPort(dst))
	_, err := h.WriteTo(w)
	return err
}
