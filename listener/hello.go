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
// from backendSSL before the splice). The bytes are peeked through an
// fdPeeker (peek.go) and parsed by internal/wire.
//
// Typical use, in admission (routes.go):
//
//	h, err := preread(fd, rs.PrereadTimeout(), s) // SSLRequest answered, hello peeked
//	if err != nil { /* close: err is a *wire.Error with a Reason */ }
//	svc := rs.Match(h.SNI, h.ALPN) // nil: no route
//	... dial bc ...
//	if h.Proto == wire.ProtoPostgres { err = backendSSL(bc, timeout) } // before the splice

import (
	"fmt"
	"io"
	"sync"
	"time"

	"fulcrum/internal/wire"
)

// DefaultPrereadTimeout is preread_timeout's default.
const DefaultPrereadTimeout = 5 * time.Second

// helloBufs lends preread (and readHeader) its wire.MaxHello buffer; only
// the SNI and ALPN strings are copied out of it.
var helloBufs = sync.Pool{New: func() any { return new([wire.MaxHello]byte) }}

// preread waits, within timeout, for the first bytes of the client on
// descriptor fd (a non-blocking socket) and reads its ClientHello without
// consuming it. A client starting with an SSLRequest is answered 'S' (its
// 8 bytes consumed) and its ClientHello is read the same way, within the
// same timeout. A client that starts with anything else, or sends nothing
// within timeout (a server-first protocol), gets wire.ProtoNone and nothing
// consumed. A wait for the first bytes is done in an event loop of loops
// (in Go's poller when loops is nil). The error is a *wire.Error.
func preread(fd int, timeout time.Duration, loops loopSource) (wire.Hello, error) {
	if timeout <= 0 {
		timeout = DefaultPrereadTimeout
	}
	buf := helloBufs.Get().(*[wire.MaxHello]byte)
	defer helloBufs.Put(buf)
	p := fdPeeker{fd: fd, loops: loops, timeout: timeout}
	defer p.close()

	n, err := p.peek(buf[:], 0)
	proto := wire.ProtoNone
	for err == nil {
		var done bool
		if proto, done = wire.Started(buf[:n]); done || n == len(buf) {
			break
		}
		n, err = p.peek(buf[:], n) // an SSLRequest's first bytes
	}
	switch {
	case n == 0 && deadlineHit(err):
		return wire.Hello{}, nil // nothing sent: a server-first protocol
	case proto == wire.ProtoCancel: // not TLS, and not routed by name (cancel.go)
		l, _ := wire.CancelLen(buf[:n])
		return wire.Hello{Proto: wire.ProtoCancel, Len: l}, nil
	case proto == wire.ProtoPostgres && err == nil:
		if err = answerSSL(fd); err != nil {
			return wire.Hello{}, readFailed(err)
		}
		n, err = p.peek(buf[:], 0)
	case proto == wire.ProtoTLS:
	case err != nil: // closed, or stopped inside an SSLRequest
		return wire.Hello{}, readFailed(err)
	default:
		return wire.Hello{}, nil
	}
	// Parsed here rather than deeper down: the connection's goroutine then
	// needs no more stack than it grows to anyway for the dial.
	total, err := helloRecords(&p, buf[:], n, err)
	if err != nil {
		return wire.Hello{}, err
	}
	h, err := wire.ParseHello(buf[:total])
	h.Proto = proto // TLS, or Postgres
	return h, err
}

// helloRecords returns the length of the records carrying the ClientHello
// at the start of p's pending bytes, of which buf holds the first n
// (peeked, with error err), peeking again until they are all there. The
// hello has mostly come whole with its first byte.
func helloRecords(p *fdPeeker, buf []byte, n int, err error) (int, error) {
	for err == nil {
		total, lerr := wire.HelloLen(buf[:n])
		switch {
		case lerr != nil:
			return 0, lerr
		case total > 0:
			return total, nil
		case n == len(buf): // helloLen refuses that itself
			return 0, &wire.Error{Reason: wire.ReasonTooLarge, Err: fmt.Errorf("no whole ClientHello in %d bytes", n)}
		}
		n, err = p.peek(buf, n)
	}
	return 0, readFailed(err)
}

// readFailed turns the error of a read inside the first message into a
// *wire.Error.
func readFailed(err error) error {
	if deadlineHit(err) {
		return &wire.Error{Reason: wire.ReasonTimeout, Err: err}
	}
	return &wire.Error{Reason: wire.ReasonClosed, Err: err}
}

// answerSSL consumes the client's SSLRequest, which preread has peeked
// (so the read does not wait), and accepts it: the client sends its
// ClientHello next. fd is non-blocking; one byte into its empty send
// buffer does not wait either.
func answerSSL(fd int) error {
	var b [len(wire.SSLRequest)]byte
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
// socket) then follows by splice. Anything else is a *wire.Error with
// wire.ReasonNoSSL, to be treated like a failed connect.
func backendSSL(bc int, timeout time.Duration) error {
	if _, err := fdWriter(bc).Write(wire.SSLRequest[:]); err != nil {
		return &wire.Error{Reason: wire.ReasonNoSSL, Err: fmt.Errorf("send SSLRequest: %w", err)}
	}
	f, err := pollable(bc) // the answer takes a round trip: wait for it in Go's poller
	if err != nil {
		return &wire.Error{Reason: wire.ReasonNoSSL, Err: err}
	}
	defer f.Close()
	if timeout > 0 {
		f.SetReadDeadline(time.Now().Add(timeout))
	}
	var b [1]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return &wire.Error{Reason: wire.ReasonNoSSL, Err: fmt.Errorf("read the SSLRequest answer: %w", err)}
	}
	if b[0] != 'S' {
		return &wire.Error{Reason: wire.ReasonNoSSL, Err: fmt.Errorf("answered %q to SSLRequest", b[0])}
	}
	return nil
}
