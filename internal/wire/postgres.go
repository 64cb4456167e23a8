package wire

import (
	"bytes"
	"encoding/binary"
)

// PostgreSQL's first messages, as fulcrum tells them apart before routing.
const (
	// MinCancel is a CancelRequest's length with a 4-byte key (protocol 3.0):
	// length, code, process ID and key.
	MinCancel = 16
	// MaxCancel is its length with the longest key of protocol 3.2 (256 bytes).
	MaxCancel = 12 + 256
)

// SSLRequest is PostgreSQL's SSLRequest: length 8, code 80877103.
var SSLRequest = [8]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// cancelCode is 80877102, as a CancelRequest carries it after its length.
var cancelCode = [4]byte{0x04, 0xd2, 0x16, 0x2e}

// Started tells what a client's first bytes b (at least one) start: TLS
// (told by the first byte; HelloLen reads on), an SSLRequest (done once
// whole), a CancelRequest (done once whole), or anything else (done at
// once). Returns: the protocol, and done false while b is a prefix of an
// SSLRequest or CancelRequest that more bytes may complete.
func Started(b []byte) (p Proto, done bool) {
	switch b[0] {
	case recordHandshake:
		return ProtoTLS, true
	case 0: // a PostgreSQL message length: an SSLRequest?
		k := min(len(b), len(SSLRequest))
		if !bytes.Equal(b[:k], SSLRequest[:k]) {
			return startedCancel(b) // a CancelRequest; or GSSENCRequest, StartupMessage: not TLS
		}
		if k == len(SSLRequest) {
			return ProtoPostgres, true
		}
		return ProtoNone, false
	}
	return ProtoNone, true // another protocol
}

// CancelLen tells whether b, a client's first bytes, start a
// CancelRequest. Returns: false when they do not; true with 0 while b is
// too short to tell; true with the packet's length (b may hold less of it)
// when its header says so.
func CancelLen(b []byte) (int, bool) {
	var h [8]byte
	k := copy(h[:], b)
	if k > 0 && h[0] != 0 || k > 1 && h[1] != 0 || k > 2 && h[2] > MaxCancel>>8 {
		return 0, false
	}
	for i := 4; i < k; i++ {
		if h[i] != cancelCode[i-4] {
			return 0, false
		}
	}
	if k < len(h) {
		return 0, true
	}
	n := int(binary.BigEndian.Uint32(h[:4]))
	if n < MinCancel || n > MaxCancel {
		return 0, false
	}
	return n, true
}

// startedCancel is Started's answer for first bytes that are not an
// SSLRequest: a whole CancelRequest, one still arriving (not done), or
// anything else.
func startedCancel(b []byte) (Proto, bool) {
	n, ok := CancelLen(b)
	switch {
	case !ok:
		return ProtoNone, true
	case n == 0 || len(b) < n:
		return ProtoNone, false
	}
	return ProtoCancel, true
}
