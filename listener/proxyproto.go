package listener

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"golang.org/x/sys/unix"
)

// The PROXY protocol (HAProxy's, v1 text and v2 binary), read from trusted
// balancers in front of fulcrum and written to backends behind it. Headers
// are parsed and formatted by github.com/pires/go-proxyproto. Reading keeps
// the zero-copy path: the header is peeked (MSG_PEEK) until all of it has
// arrived, parsed from those bytes, and then exactly its length is consumed,
// so the socket handed to splice holds the client's first byte next.

const (
	maxV1Header = 107        // the longest v1 line, CRLF included
	maxV2Header = 16 + 1<<12 // a v2 header with up to 4 KiB of addresses and TLVs
	v2Fixed     = 16         // signature, version/command, family, length
	v1Sig       = "PROXY "   // proxyproto.SIGV1 plus the space that follows it
	v2Sig       = "\r\n\r\n\x00\r\nQUIT\n"
)

var (
	errNoHeader   = errors.New("no PROXY header")
	errBadHeader  = errors.New("malformed PROXY header")
	errSpoofed    = errors.New("PROXY header from a source not in accept_proxy")
	errBigHeader  = errors.New("PROXY header too large")
	errShortHello = errors.New("connection closed inside its PROXY header")
)

// headerLen returns the length of the PROXY header at the start of b, 0 if
// more bytes are needed to tell, or an error if b cannot start one.
func headerLen(b []byte) (int, error) {
	if n := min(len(b), len(v2Sig)); string(b[:n]) == v2Sig[:n] {
		if len(b) < v2Fixed {
			return 0, nil
		}
		total := v2Fixed + int(binary.BigEndian.Uint16(b[14:16]))
		if total > maxV2Header {
			return 0, errBigHeader
		}
		if len(b) < total {
			return 0, nil
		}
		return total, nil
	}
	if n := min(len(b), len(v1Sig)); string(b[:n]) == v1Sig[:n] {
		if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
			if i+2 > maxV1Header {
				return 0, errBadHeader
			}
			return i + 2, nil
		}
		if len(b) >= maxV1Header {
			return 0, errBadHeader
		}
		return 0, nil
	}
	if len(b) == 0 {
		return 0, nil
	}
	return 0, errNoHeader
}

// parseHeader parses a whole header (exactly b) with go-proxyproto.
func parseHeader(b []byte) (*proxyproto.Header, error) {
	h, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(b), max(len(b), 16)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadHeader, err)
	}
	return h, nil
}

// peek waits, until c's read deadline, for bytes that decide(b) accepts:
// decide returns done when b is enough to stop. It consumes nothing.
func peek(c *net.TCPConn, buf []byte, decide func(b []byte) (done bool)) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	return peekRaw(rc, buf, decide)
}

// peekRaw is peek on a socket in Go's poller, until its read deadline.
func peekRaw(rc syscall.RawConn, buf []byte, decide func(b []byte) (done bool)) (int, error) {
	var n int
	var perr error
	err := rc.Read(func(fd uintptr) bool {
		k, _, e := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK)
		switch {
		case e == unix.EAGAIN || e == unix.EINTR:
			return false // nothing yet: wait for readability
		case e != nil:
			perr = e
			return true
		case k == 0:
			perr = io.EOF
			return true
		}
		n = k
		if decide(buf[:k]) || k == len(buf) {
			return true
		}
		// Part of what is needed. A peek still sees the pending bytes after
		// the peer's FIN, so ask whether it has finished sending.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if m, _ := unix.Poll(pfd, 0); m > 0 && pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			perr = io.EOF
			return true
		}
		return false // wait for more (a new edge)
	})
	if err == nil {
		err = perr
	}
	return n, err
}

// readHeader reads the PROXY header a trusted balancer must send first,
// within timeout, and consumes exactly it.
func readHeader(c *net.TCPConn, timeout time.Duration) (*proxyproto.Header, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, maxV2Header)
	var total int
	var herr error
	n, err := peek(c, buf, func(b []byte) bool {
		total, herr = headerLen(b)
		return herr != nil || total > 0
	})
	switch {
	case herr != nil:
		return nil, herr
	case total == 0 && errors.Is(err, io.EOF):
		return nil, errShortHello
	case total == 0 && err != nil:
		return nil, fmt.Errorf("%w: %v", errNoHeader, err)
	case total == 0:
		return nil, fmt.Errorf("%w in %d bytes", errBadHeader, n)
	}
	h, err := parseHeader(buf[:total])
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(c, buf[:total]); err != nil { // consume what was peeked
		return nil, err
	}
	return h, nil
}

// spoofed reports whether a client that is not trusted to send a PROXY
// header starts with one. It waits for the first bytes until timeout; a
// client that sends nothing by then (a server-first protocol) is not
// spoofing. One whose first bytes are still a prefix of a signature at the
// timeout is refused as one: letting it through would let the rest of a
// header follow a pause, and no client protocol starts with a part of
// "PROXY " or of the v2 signature and then waits. It consumes nothing.
func spoofed(c *net.TCPConn, timeout time.Duration) (bool, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(v2Sig))
	var match bool
	n, err := peek(c, buf, func(b []byte) bool {
		_, herr := headerLen(b)
		match = herr == nil || errors.Is(herr, errBadHeader) || errors.Is(herr, errBigHeader)
		full := len(b) >= len(v1Sig) && string(b[:len(v1Sig)]) == v1Sig || len(b) >= len(v2Sig)
		return !match || full // decided: no signature, or a whole signature
	})
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return n > 0 && match, nil // a signature begun and not finished in time is refused
	case errors.Is(err, io.EOF):
		return false, nil // too little to be a header, and nothing more will come
	}
	return match, err
}

// addrs returns the client and original destination a header carries, or
// ok false for a LOCAL/UNKNOWN header (a balancer's own health check).
func addrs(h *proxyproto.Header) (src, dst netip.AddrPort, ok bool) {
	s, sok := h.SourceAddr.(*net.TCPAddr)
	d, dok := h.DestinationAddr.(*net.TCPAddr)
	if h.Command.IsLocal() || !sok || !dok {
		return src, dst, false
	}
	src, dst = s.AddrPort(), d.AddrPort()
	return unmap(src), unmap(dst), true
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// writeHeader sends a PROXY header of version 1 or 2 for a connection from
// src to dst, before any client byte.
func writeHeader(c io.Writer, version int, src, dst netip.AddrPort) error {
	if src.Addr().Is4() != dst.Addr().Is4() { // the protocol needs one family: keep the client's
		if src.Addr().Is4() {
			dst = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		} else {
			dst = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
	}
	h := proxyproto.HeaderProxyFromAddrs(byte(version), net.TCPAddrFromAddrPort(src), net.TCPAddrFromAddrPort(dst))
	_, err := h.WriteTo(c)
	return err
}
