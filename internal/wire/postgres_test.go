package wire

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestCancelStart: the framing CancelLen and Started tell a
// CancelRequest by, protocol 3.2's longer keys included.
func TestCancelStart(t *testing.T) {
	packet := func(key int) []byte {
		b, err := (&pgproto3.CancelRequest{ProcessID: 4242, SecretKey: make([]byte, key)}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, key := range []int{4, 32, 256} {
		b := packet(key)
		if n, ok := CancelLen(b); !ok || n != len(b) {
			t.Errorf("key of %d bytes: CancelLen = %d, %v; want %d, true", key, n, ok, len(b))
		}
		for k := 1; k < len(b); k++ { // still arriving: not done
			if p, done := Started(b[:k]); done || p != ProtoNone {
				t.Errorf("key of %d bytes, first %d bytes: Started = %v, %v; want none, not done", key, k, p, done)
			}
		}
		if p, done := Started(b); !done || p != ProtoCancel {
			t.Errorf("key of %d bytes: Started = %v, %v; want postgres-cancel, done", key, p, done)
		}
	}
	startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "x"}}).Encode(nil)
	long := packet(256)
	long[3]++ // a key of 257 bytes
	for name, b := range map[string][]byte{"startup": startup, "ssl": SSLRequest[:], "too long": long, "mysql": []byte("J\x00\x00\x00\x0a8.0")} {
		if _, ok := CancelLen(b); ok {
			t.Errorf("%s: CancelLen says a CancelRequest", name)
		}
	}
}
