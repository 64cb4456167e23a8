package listener

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"fulcrum/internal/wire"
)

// The PROXY protocol (HAProxy's, v1 text and v2 binary), read from trusted
// balancers in front of fulcrum; internal/wire frames and parses it. Reading
// keeps the zero-copy path: the header is peeked (MSG_PEEK) on the client's
// own descriptor, through the fdPeeker the ClientHello is read with
// (peek.go), until all of it has arrived, parsed from those bytes, and then
// exactly its length is consumed, so the socket handed to splice holds the
// client's first byte next.

var (
	errSpoofed    = errors.New("PROXY header from a source not in accept_proxy")
	errShortHello = errors.New("connection closed inside its PROXY header")
)

// readHeader reads the PROXY header a trusted balancer must send first on
// client socket fd, waiting for it (in one of loops) within timeout, and
// consumes exactly it.
func readHeader(fd int, timeout time.Duration, loops loopSource) (*proxyproto.Header, error) {
	buf := helloBufs.Get().(*[wire.MaxHello]byte) // larger than any header (wire.MaxV2Header)
	defer helloBufs.Put(buf)
	p := fdPeeker{fd: fd, loops: loops, timeout: timeout}
	defer p.close()
	n, err := p.peek(buf[:], 0)
	total := 0
	for err == nil {
		var herr error
		if total, herr = wire.HeaderLen(buf[:n]); herr != nil {
			return nil, herr
		}
		if total > 0 || n == len(buf) {
			break
		}
		n, err = p.peek(buf[:], n)
	}
	switch {
	case total == 0 && errors.Is(err, io.EOF):
		return nil, errShortHello
	case total == 0 && err != nil:
		return nil, fmt.Errorf("%w: %v", wire.ErrNoHeader, err)
	case total == 0:
		return nil, fmt.Errorf("%w in %d bytes", wire.ErrBadHeader, n)
	}
	h, err := wire.ParseHeader(buf[:total])
	if err != nil {
		return nil, err
	}
	if err := readAll(fd, buf[:total]); err != nil { // consume what was peeked
		return nil, err
	}
	return h, nil
}

// spoofed reports whether a client (socket fd) that is not trusted to send
// a PROXY header starts with one. It waits for the first bytes (in one of
// loops) until timeout; a client that sends nothing by then (a
// server-first protocol) is not spoofing. One whose first bytes are still
// a prefix of a signature at the timeout is refused as one: letting it
// through would let the rest of a header follow a pause, and no client
// protocol starts with a part of "PROXY " or of the v2 signature and then
// waits. It consumes nothing.
func spoofed(fd int, timeout time.Duration, loops loopSource) (bool, error) {
	var buf [len(wire.V2Sig)]byte
	p := fdPeeker{fd: fd, loops: loops, timeout: timeout}
	defer p.close()
	n, err := p.peek(buf[:], 0)
	match := false
	for err == nil {
		var decided bool
		if match, decided = wire.SignatureStart(buf[:n]); decided || n == len(buf) {
			break // no signature, or a whole one
		}
		n, err = p.peek(buf[:], n)
	}
	switch {
	case deadlineHit(err):
		return n > 0 && match, nil // a signature begun and not finished in time is refused
	case errors.Is(err, io.EOF):
		return false, nil // too little to be a header, and nothing more will come
	}
	return match, err
}

// proxyHeader reads the PROXY header of a trusted balancer on client
// socket fd, which may change client and orig, and refuses one from
// anyone else. It waits in one of s's loops. It returns why when the
// connection must go.
func (s *Server) proxyHeader(pol *Policy, fd int, client, orig *netip.AddrPort) (Reject, error) {
	if len(pol.AcceptProxy) == 0 {
		return 0, nil
	}
	if pol.TrustsProxy(client.Addr()) {
		h, err := readHeader(fd, pol.ProxyTimeout, s)
		if err != nil {
			return RejectProxy, err
		}
		if src, dst, ok := wire.Addrs(h); ok {
			*client, *orig = src, dst
		}
	} else if bad, err := spoofed(fd, pol.ProxyTimeout, s); bad || err != nil {
		if err == nil {
			err = errSpoofed
		}
		return RejectProxy, err
	}
	return 0, nil
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
