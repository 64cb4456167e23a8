package wire

// The TLS ClientHello, read for its server name (SNI) and protocols (ALPN)
// without terminating TLS. The structures are parsed with
// golang.org/x/crypto/cryptobyte, as crypto/tls parses them.

import (
	"encoding/binary"
	"fmt"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// MaxHello bounds the TLS records that carry a ClientHello, their headers
// included: a longer hello is refused (ReasonTooLarge). Today's largest,
// with post-quantum key shares, take about 2 KiB.
const MaxHello = 16 << 10

// TLS wire constants.
const (
	recordHeader    = 5  // content type, version, length
	recordHandshake = 22 // content type of handshake records
	maxRecord       = 1 << 14
	typeClientHello = 1
	extServerName   = 0
	extALPN         = 16
	hostName        = 0 // server_name name_type
)

// Proto is what a client started with.
type Proto uint8

const (
	ProtoNone     Proto = iota // not TLS: another protocol, a GSSENCRequest or StartupMessage, or nothing yet
	ProtoTLS                   // a TLS ClientHello
	ProtoPostgres              // PostgreSQL's SSLRequest (answered and consumed), then a TLS ClientHello
	ProtoCancel                // a whole PostgreSQL CancelRequest (peeked, not consumed; Len is its length): listener/cancel.go
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

// Hello is what a client's first bytes say.
type Hello struct {
	Proto Proto
	SNI   string   // the host name, lowercased; "" when none was sent (or not TLS)
	ALPN  []string // the protocols offered, in the client's order; nil when none
	Len   int      // bytes of the records carrying the ClientHello (peeked, not consumed)
}

// Reasons a client is refused for its first bytes (or a backend for its
// answer to an SSLRequest), as logs and counters name them.
const (
	ReasonMalformed = "hello-malformed" // not a well-formed ClientHello after a TLS or SSLRequest start
	ReasonTooLarge  = "hello-too-large" // the ClientHello's records exceed MaxHello
	ReasonTimeout   = "preread-timeout" // the client stopped inside its first message
	ReasonClosed    = "hello-closed"    // the client closed or reset inside its first message
	ReasonNoSSL     = "backend-no-ssl"  // a backend did not accept an SSLRequest
)

// Error is why a client's first bytes, or a backend's answer to an
// SSLRequest, cannot be routed; Reason names it for logs and counters.
type Error struct {
	Reason string // one of the Reason constants
	Err    error  // the detail
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func malformed(format string, a ...any) error {
	return &Error{Reason: ReasonMalformed, Err: fmt.Errorf(format, a...)}
}

// HelloLen returns the length of the TLS records at the start of b that
// carry the whole first handshake message, 0 if more bytes are needed, or
// an error if b cannot start a ClientHello or it would exceed MaxHello. It
// looks at framing only; ParseHello reads the message.
func HelloLen(b []byte) (int, error) {
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
	return &Error{Reason: ReasonTooLarge, Err: fmt.Errorf("ClientHello takes %d bytes or more, over %d", n, MaxHello)}
}

// ParseHello parses the records of a whole ClientHello (exactly what
// HelloLen measured) for its server name and ALPN protocols. The message is
// read in place when one record carries it, as nearly every client sends
// it; a hello spread over several records is joined into one copy. It is
// split in steps whose frames are off the stack before the next, so that
// the connection's goroutine needs no more stack than its dial does.
func ParseHello(b []byte) (Hello, error) {
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
