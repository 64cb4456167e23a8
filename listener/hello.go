package listener

// Reading what a client says first, to route by it without terminating TLS:
// the server name (SNI) and protocols (ALPN) of a TLS ClientHello, and
// PostgreSQL's SSLRequest, which precedes the ClientHello of every libpq
// client that wants TLS.
//
// The ClientHello is peeked (MSG_PEEK), never consumed: once the route is
// chosen, the socket handed to splice still holds the client's first byte
// next, so the zero-copy path is kept. Only an SSLRequest is consumed,
// because fulcrum answers it itself (the backend gets its own SSLRequest
// from backendSSL before the splice). The TLS structures are parsed with
// golang.org/x/crypto/cryptobyte, as crypto/tls parses them.
//
// Typical use, in admission (routes.go):
//
//	h, err := preread(fd, rs.PrereadTimeout(), s) // SSLRequest answered, hello peeked
//	if err != nil { /* close: err is a *PrereadError with a Reason */ }
//	svc := rs.Match(h.SNI, h.ALPN) // nil: no route
//	... dial bc ...
//	if h.Proto == ProtoPostgres { err = backendSSL(bc, timeout) } // before the splice

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/sys/unix"
)

const (
	// MaxHello bounds the TLS records that carry a ClientHello, their
	// headers included: a longer hello is refused (ReasonTooLarge). Today's
	// largest, with post-quantum key shares, take about 2 KiB.
	MaxHello = 16 << 10
	// DefaultPrereadTimeout is preread_timeout's default.
	DefaultPrereadTimeout = 5 * time.Second
)

// TLS and PostgreSQL wire constants.
const (
	recordHeader      = 5  // content type, version, length
	recordHandshake   = 22 // content type of handshake records
	maxRecord         = 1 << 14
	typeClientHello   = 1
	extServerName     = 0
	extALPN           = 16
	hostName          = 0 // server_name name_type
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

// sslRequest is PostgreSQL's SSLRequest: length 8, code 80877103.
var sslRequest = [8]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// Proto is what a client started with.
type Proto uint8

const (
	ProtoNone     Proto = iota // not TLS: another protocol, a GSSENCRequest or StartupMessage, or nothing yet
	ProtoTLS                   // a TLS ClientHello
	ProtoPostgres              // PostgreSQL's SSLRequest (answered and consumed), then a TLS ClientHello
	ProtoCancel                // a whole PostgreSQL CancelRequest (peeked, not consumed; Len is its length): cancel.go
)

func (p Proto) String() string {
	switch p {
	case ProtoTLS:
		return "tls"
	case ProtoPostgres:
		return "postgres-tls"
	case ProtoCancel:
		return "postgres-cancel"
	}
	return "none"
}

// Hello is what preread learnt from a client's first bytes.
type Hello struct {
	Proto Proto
	SNI   string   // the host name, lowercased; "" when none was sent (or not TLS)
	ALPN  []string // the protocols offered, in the client's order; nil when none
	Len   int      // bytes of the records carrying the ClientHello (peeked, not consumed)
}

// Reasons a preread refuses a connection, as logs and counters name them.
const (
	ReasonMalformed = "hello-malformed" // not a well-formed ClientHello after a TLS or SSLRequest start
	ReasonTooLarge  = "hello-too-large" // the ClientHello's records exceed MaxHello
	ReasonTimeout   = "preread-timeout" // the client stopped inside its first message
	ReasonClosed    = "hello-closed"    // the client closed or reset inside its first message
	ReasonNoSSL     = "backend-no-ssl"  // a backend did not accept an SSLRequest
)

// PrereadError is why a client's first bytes, or a backend's answer to an
// SSLRequest, cannot be routed.
type PrereadError struct {
	Reason string // one of the Reason constants
	Err    error  // the detail
}

func (e *PrereadError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *PrereadError) Unwrap() error { return e.Err }

func malformed(format string, a ...any) error {
	return &PrereadError{Reason: ReasonMalformed, Err: fmt.Errorf(format, a...)}
}

// helloBufs lends preread its MaxHello buffer; only the SNI and ALPN strings
// are copied out of it.
var helloBufs = sync.Pool{New: func() any { return new([MaxHello]byte) }}

// preread waits, within timeout, for the first bytes of the client on
// descriptor fd (a non-blocking socket) and reads its ClientHello without
// consuming it. A client starting with an SSLRequest is answered 'S' (its
// 8 bytes consumed) and its ClientHello is read the same way, within the
// same timeout. A client that starts with anything else, or sends nothing
// within timeout (a server-first protocol), gets ProtoNone and nothing
// consumed. A wait for the first bytes is done in an event loop of loops
// (in Go's poller when loops is nil). The error is a *PrereadError.
func preread(fd int, timeout time.Duration, loops loopSource) (Hello, error) {
	if timeout <= 0 {
		timeout = DefaultPrereadTimeout
	}
	buf := helloBufs.Get().(*[MaxHello]byte)
	defer helloBufs.Put(buf)
	p := fdPeeker{fd: fd, loops: loops, timeout: timeout}
	defer p.close()

	n, err := p.peek(buf[:], 0)
	proto := ProtoNone
	for err == nil {
		var done bool
		if proto, done = started(buf[:n]); done || n == len(buf) {
			break
		}
		n, err = p.peek(buf[:], n) // an SSLRequest's first bytes
	}
	switch {
	case n == 0 && deadlineHit(err):
		return Hello{}, nil // nothing sent: a server-first protocol
	case proto == ProtoCancel: // not TLS, and not routed by name (cancel.go)
		l, _ := cancelStart(buf[:n])
		return Hello{Proto: ProtoCancel, Len: l}, nil
	case proto == ProtoPostgres && err == nil:
		if err = answerSSL(fd); err != nil {
			return Hello{}, readFailed(err)
		}
		n, err = p.peek(buf[:], 0)
	case proto == ProtoTLS:
	case err != nil: // closed, or stopped inside an SSLRequest
		return Hello{}, readFailed(err)
	default:
		return Hello{}, nil
	}
	// Parsed here rather than deeper down: the connection's goroutine then
	// needs no more stack than it grows to anyway for the dial.
	total, err := helloRecords(&p, buf[:], n, err)
	if err != nil {
		return Hello{}, err
	}
	h, err := parseHello(buf[:total])
	h.Proto = proto // TLS, or Postgres
	return h, err
}

// started tells what a client's first bytes b (at least one) start: TLS
// (told by the first byte; helloRecords reads on), an SSLRequest (done once
// whole), or anything else (done at once).
func started(b []byte) (Proto, bool) {
	switch b[0] {
	case recordHandshake:
		return ProtoTLS, true
	case 0: // a PostgreSQL message length: an SSLRequest?
		k := min(len(b), len(sslRequest))
		if !bytes.Equal(b[:k], sslRequest[:k]) {
			return startedCancel(b) // a CancelRequest; or GSSENCRequest, StartupMessage: not TLS
		}
		if k == len(sslRequest) {
			return ProtoPostgres, true
		}
		return ProtoNone, false
	}
	return ProtoNone, true // another protocol
}

// helloRecords returns the length of the records carrying the ClientHello
// at the start of p's pending bytes, of which buf holds the first n
// (peeked, with error err), peeking again until they are all there. The
// hello has mostly come whole with its first byte.
func helloRecords(p *fdPeeker, buf []byte, n int, err error) (int, error) {
	for err == nil {
		total, lerr := helloLen(buf[:n])
		switch {
		case lerr != nil:
			return 0, lerr
		case total > 0:
			return total, nil
		case n == len(buf): // helloLen refuses that itself
			return 0, &PrereadError{Reason: ReasonTooLarge, Err: fmt.Errorf("no whole ClientHello in %d bytes", n)}
		}
		n, err = p.peek(buf, n)
	}
	return 0, readFailed(err)
}

// fdPeeker peeks at a client's non-blocking socket: at what has arrived,
// without waiting, and only when that is not enough, waits, until timeout
// after its first wait. A client's first message has mostly arrived by the
// time it is accepted, so most connections never wait, nor read the clock
// for a deadline (0.1 µs here, a third of the parse). A wait for the first bytes is done in a
// loop's epoll, where the session will register the socket anyway; a wait
// for more of a message that has begun (rare: a hello split across
// segments) in Go's poller through a duplicate of the descriptor, whose
// edge-triggered registration sees new bytes behind those already peeked.
type fdPeeker struct {
	fd       int
	loops    loopSource // where to wait for first bytes; nil: Go's poller
	timeout  time.Duration
	deadline time.Time // zero until the first wait
	lp       *loop     // the loop of loops that fd is registered in, once it is
	inLoop   bool      // fd is registered in lp
	f        *os.File  // the duplicate in Go's poller; nil until needed
}

// loopSource lends event loops; a *Server is one.
type loopSource interface {
	loop() (*loop, error)
}

// peek fills buf with what fd holds, once that is more than seen bytes,
// waiting for it until the deadline: io.EOF if the client closes first.
func (p *fdPeeker) peek(buf []byte, seen int) (int, error) {
	for {
		n, err := recvPeek(p.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil && (n > seen || n == len(buf)):
			return n, nil
		case err != nil && err != unix.EAGAIN:
			return 0, err
		case err == nil || p.loops == nil: // seen bytes and no more yet, or no loop
			return p.peekPoller(buf, seen)
		}
		if p.lp == nil {
			if p.lp, err = p.loops.loop(); err != nil {
				p.loops = nil // wait the other way
				continue
			}
		}
		switch err := p.lp.await(p.fd, unix.EPOLLIN|unix.EPOLLRDHUP, p.until(), &p.inLoop); {
		case deadlineHit(err):
			return 0, err
		case err != nil: // the epoll refused it (out of memory or watches): wait the other way
			p.loops = nil
		}
	}
}

// peekPoller is peek waiting in Go's poller, on a duplicate of the socket.
func (p *fdPeeker) peekPoller(buf []byte, seen int) (int, error) {
	if p.f == nil {
		var err error
		if p.f, err = pollable(p.fd); err != nil {
			return 0, err
		}
		p.f.SetReadDeadline(p.until())
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	return peekRaw(rc, buf, func(b []byte) bool { return len(b) > seen })
}

// until returns the deadline of every wait, set by the first.
func (p *fdPeeker) until() time.Time {
	if p.deadline.IsZero() {
		p.deadline = time.Now().Add(p.timeout)
	}
	return p.deadline
}

// close closes the duplicate, if any; the socket stays open.
func (p *fdPeeker) close() {
	if p.f != nil {
		p.f.Close()
	}
}

// pollable returns a duplicate of the non-blocking socket fd as a file in
// Go's poller, whose deadlines work: the cheapest way to wait for it (a
// net.Conn would cost a second duplicate and address lookups). The caller
// closes it; fd stays open.
func pollable(fd int) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(nfd), "socket"), nil // non-blocking, so in the poller
}

// recvPeek peeks at what fd holds, without waiting.
func recvPeek(fd int, buf []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func deadlineHit(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// readFailed turns the error of a read inside the first message into a
// *PrereadError.
func readFailed(err error) error {
	if deadlineHit(err) {
		return &PrereadError{Reason: ReasonTimeout, Err: err}
	}
	return &PrereadError{Reason: ReasonClosed, Err: err}
}

// helloLen returns the length of the TLS records at the start of b that
// carry the whole first handshake message, 0 if more bytes are needed, or
// an error if b cannot start a ClientHello or it would exceed MaxHello. It
// looks at framing only; parseHello reads the message.
func helloLen(b []byte) (int, error) {
	s := cryptobyte.String(b)
	off := 0       // bytes of the whole records before this one
	hb := 0        // handshake bytes in them
	var hs [4]byte // the handshake header, which may itself span records
	need := -1     // the handshake message's length, header included, once known
	for {
		var typ uint8
		var ver, rlen uint16
		if !s.ReadUint8(&typ) || !s.ReadUint16(&ver) || !s.ReadUint16(&rlen) {
			if off+recordHeader > MaxHello {
				return 0, tooLarge(off + recordHeader)
			}
			return 0, nil
		}
		switch {
		case typ != recordHandshake:
			return 0, malformed("record type %d inside the ClientHello", typ)
		case ver>>8 != 3:
			return 0, malformed("record version %#04x", ver)
		case rlen == 0 || rlen > maxRecord:
			return 0, malformed("record length %d", rlen)
		case off+recordHeader+int(rlen) > MaxHello:
			return 0, tooLarge(off + recordHeader + int(rlen))
		}
		frag := []byte(s)
		if len(frag) > int(rlen) {
			frag = frag[:rlen]
		}
		if hb < len(hs) && need < 0 {
			if k := copy(hs[hb:], frag); hb+k == len(hs) {
				if hs[0] != typeClientHello {
					return 0, malformed("handshake type %d, not ClientHello", hs[0])
				}
				need = len(hs) + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
				// The fewest bytes the hello can take, were the rest of it
				// in this record, must fit.
				if least := off + recordHeader + need - hb; least > MaxHello {
					return 0, tooLarge(least)
				}
			}
		}
		if !s.Skip(int(rlen)) {
			return 0, nil // the record is not all here yet
		}
		off += recordHeader + int(rlen)
		hb += int(rlen)
		if need >= 0 && hb >= need {
			return off, nil
		}
	}
}

func tooLarge(n int) error {
	return &PrereadError{Reason: ReasonTooLarge, Err: fmt.Errorf("ClientHello takes %d bytes or more, over %d", n, MaxHello)}
}

// parseHello parses the records of a whole ClientHello (exactly what
// helloLen measured) for its server name and ALPN protocols. The message is
// read in place when one record carries it, as nearly every client sends
// it; a hello spread over several records is joined into one copy. It is
// split in steps whose frames are off the stack before the next, so that
// the connection's goroutine needs no more stack than its dial does.
func parseHello(b []byte) (Hello, error) {
	h := Hello{Len: len(b)}
	exts, err := helloExtensions(helloMessage(b))
	if err == nil && exts != nil {
		err = h.readExtensions(exts)
	}
	return h, err
}

// helloMessage returns the handshake message that records b carry.
func helloMessage(b []byte) []byte {
	if rlen := int(binary.BigEndian.Uint16(b[3:5])); recordHeader+rlen == len(b) {
		return b[recordHeader:]
	}
	msg := make([]byte, 0, len(b))
	for len(b) > 0 {
		rlen := int(binary.BigEndian.Uint16(b[3:5]))
		msg = append(msg, b[recordHeader:recordHeader+rlen]...)
		b = b[recordHeader+rlen:]
	}
	return msg
}

// helloExtensions checks the fields of ClientHello message msg and returns
// its extensions block: nil when it has none (TLS 1.2 and older may send
// none).
func helloExtensions(msg []byte) (cryptobyte.String, error) {
	s := cryptobyte.String(msg)
	var typ uint8
	var body cryptobyte.String
	if !s.ReadUint8(&typ) || typ != typeClientHello || !s.ReadUint24LengthPrefixed(&body) {
		return nil, malformed("no ClientHello message")
	}
	if !s.Empty() {
		return nil, malformed("%d bytes after the ClientHello in its records", len(s))
	}
	var ver uint16
	var sessionID, suites, comp cryptobyte.String
	if !body.ReadUint16(&ver) || !body.Skip(32) || // legacy_version, random
		!body.ReadUint8LengthPrefixed(&sessionID) || len(sessionID) > 32 ||
		!body.ReadUint16LengthPrefixed(&suites) || len(suites) < 2 || len(suites)%2 != 0 ||
		!body.ReadUint8LengthPrefixed(&comp) || len(comp) < 1 {
		return nil, malformed("ClientHello fields")
	}
	if body.Empty() {
		return nil, nil
	}
	var exts cryptobyte.String
	if !body.ReadUint16LengthPrefixed(&exts) || !body.Empty() {
		return nil, malformed("ClientHello extensions")
	}
	return exts, nil
}

// readExtensions reads the server name and ALPN protocols from a
// ClientHello's extensions into h.
func (h *Hello) readExtensions(exts cryptobyte.String) error {
	var seenSNI, seenALPN bool
	for !exts.Empty() {
		var ext uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&ext) || !exts.ReadUint16LengthPrefixed(&data) {
			return malformed("extension framing")
		}
		switch ext {
		case extServerName:
			if seenSNI {
				return malformed("two server_name extensions")
			}
			seenSNI = true
			name, err := serverName(data)
			if err != nil {
				return err
			}
			h.SNI = name
		case extALPN:
			if seenALPN {
				return malformed("two ALPN extensions")
			}
			seenALPN = true
			protos, err := alpn(data)
			if err != nil {
				return err
			}
			h.ALPN = protos
		}
	}
	return nil
}

// serverName reads the server_name extension (RFC 6066, section 3): its one
// host_name, lowercased. Names of other types are skipped.
func serverName(data cryptobyte.String) (string, error) {
	var list cryptobyte.String
	if !data.ReadUint16LengthPrefixed(&list) || list.Empty() || !data.Empty() {
		return "", malformed("server_name list")
	}
	var name string
	for !list.Empty() {
		var typ uint8
		var n cryptobyte.String
		if !list.ReadUint8(&typ) || !list.ReadUint16LengthPrefixed(&n) || n.Empty() {
			return "", malformed("server_name entry")
		}
		if typ != hostName {
			continue
		}
		if name != "" {
			return "", malformed("two host names in server_name")
		}
		if len(n) > 253 {
			return "", malformed("host name of %d bytes", len(n))
		}
		upper := false
		for _, c := range n {
			switch {
			case c >= 'A' && c <= 'Z':
				upper = true
			case c <= ' ' || c >= 0x7f: // IDNA names come as A-labels (xn--), ASCII
				return "", malformed("host name byte %#02x", c)
			}
		}
		// No buffer on the stack to lowercase into: the connection's
		// goroutine would need more stack than it has (preread).
		name = string(n)
		if upper {
			name = strings.ToLower(name)
		}
	}
	return name, nil
}

// alpn reads the ALPN extension (RFC 7301, section 3.1): its protocol names,
// copied into one string that they slice.
func alpn(data cryptobyte.String) ([]string, error) {
	var list cryptobyte.String
	if !data.ReadUint16LengthPrefixed(&list) || list.Empty() || !data.Empty() {
		return nil, malformed("ALPN list")
	}
	n := 0
	for l := list; !l.Empty(); n++ {
		var p cryptobyte.String
		if !l.ReadUint8LengthPrefixed(&p) {
			break
		}
	}
	all := string(list)
	protos := make([]string, 0, n)
	off := 0
	for !list.Empty() {
		var p cryptobyte.String
		if !list.ReadUint8LengthPrefixed(&p) || p.Empty() {
			return nil, malformed("ALPN protocol name")
		}
		protos = append(protos, all[off+1:off+1+len(p)])
		off += 1 + len(p)
	}
	return protos, nil
}

// answerSSL consumes the client's SSLRequest, which preread has peeked
// (so the read does not wait), and accepts it: the client sends its
// ClientHello next. fd is non-blocking; one byte into its empty send
// buffer does not wait either.
func answerSSL(fd int) error {
	var b [len(sslRequest)]byte
	if err := readAll(fd, b[:]); err != nil {
		return err
	}
	_, err := fdWriter(fd).Write([]byte{'S'})
	return err
}

// backendSSL asks a PostgreSQL backend (bc, a fresh non-blocking socket)
// for TLS on behalf of a client whose SSLRequest fulcrum answered: it
// sends an SSLRequest and reads exactly the one byte of the answer, within
// timeout, which must be 'S'; the ClientHello (still in the client's
// socket) then follows by splice. Anything else is a *PrereadError with
// ReasonNoSSL, to be treated like a failed connect.
func backendSSL(bc int, timeout time.Duration) error {
	if _, err := fdWriter(bc).Write(sslRequest[:]); err != nil {
		return &PrereadError{Reason: ReasonNoSSL, Err: fmt.Errorf("send SSLRequest: %w", err)}
	}
	f, err := pollable(bc) // the answer takes a round trip: wait for it in Go's poller
	if err != nil {
		return &PrereadError{Reason: ReasonNoSSL, Err: err}
	}
	defer f.Close()
	if timeout > 0 {
		f.SetReadDeadline(time.Now().Add(timeout))
	}
	var b [1]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return &PrereadError{Reason: ReasonNoSSL, Err: fmt.Errorf("read the SSLRequest answer: %w", err)}
	}
	if b[0] != 'S' {
		return &PrereadError{Reason: ReasonNoSSL, Err: fmt.Errorf("answered %q to SSLRequest", b[0])}
	}
	return nil
}
