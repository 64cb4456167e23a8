package torture

import (
	"bytes"
	"testing"
)

// TestVerifier holds the stream checker to what the harness relies on: an
// exact stream passes in any cut, an urgent byte passes dropped or in its
// place, and a wrong byte is found where it is, named as another
// connection's when it is one.
func TestVerifier(t *testing.T) {
	const n = 1000
	s := make([]byte, n)
	fill(7, dirUp, 0, s)
	feed := func(v *verifier, b []byte, step int) {
		for len(b) > 0 {
			k := min(step, len(b))
			v.write(b[:k])
			b = b[k:]
		}
	}
	for _, step := range []int{1, 7, 32, 33, n} {
		v := newVerifier(7, dirUp, -1)
		feed(v, s, step)
		if v.bad != nil || v.n != n || v.crc != crcOf(7, dirUp, n) {
			t.Fatalf("step %d: n %d bad %v; want all %d bytes", step, v.n, v.bad, n)
		}
		for _, at := range []int64{0, 31, 500, n} {
			v := newVerifier(7, dirUp, at) // the urgent byte dropped
			feed(v, s, step)
			if v.bad != nil || v.n != n || v.oobInline {
				t.Fatalf("step %d, urgent byte at %d dropped: n %d bad %v inline %v", step, at, v.n, v.bad, v.oobInline)
			}
			in := append(append(bytes.Clone(s[:at]), oobByte(7, dirUp, at)), s[at:]...)
			v = newVerifier(7, dirUp, at) // passed on in the stream
			feed(v, in, step)
			if v.bad != nil || v.n != n || !v.oobInline || v.crc != crcOf(7, dirUp, n) {
				t.Fatalf("step %d, urgent byte at %d inline: n %d bad %v inline %v", step, at, v.n, v.bad, v.oobInline)
			}
		}
	}
	other := make([]byte, 64)
	fill(9, dirUp, 320, other)
	bad := append(append(bytes.Clone(s[:320]), other...), s[384:]...)
	v := newVerifier(7, dirUp, -1)
	v.write(bad)
	if v.bad == nil || v.bad.foreign != 9 || v.n != 320 {
		t.Fatalf("another connection's chunks at 320: bad %+v, n %d; want connection 9 found at 320", v.bad, v.n)
	}
	bad = bytes.Clone(s)
	bad[777] ^= 1
	v = newVerifier(7, dirUp, -1)
	v.write(bad)
	if v.bad == nil || v.bad.foreign != 0 || v.bad.off != 777 {
		t.Fatalf("one flipped bit at 777: bad %+v; want a mismatch at 777", v.bad)
	}
}
