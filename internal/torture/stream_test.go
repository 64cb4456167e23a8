package torture

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// A stream is a pure function of (connection id, direction, offset): the
// bytes are cut in 32-byte chunks, each
//
//	id (8, little endian) | dir<<56 | index (8) | mix (8) | mix of mix (8)
//
// so that a receiver checks every byte against what it must be, and a
// chunk found where it does not belong names the connection it came from.
const chunkLen = 32

// Directions.
const (
	dirUp    = 1 // client to backend
	dirDown  = 2 // backend to client
	dirGreet = 3 // a server-speaks-first backend's greeting, tagged with the accept's own id
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func mix(x uint64) uint64 { // splitmix64's finaliser
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func chunk(id uint64, dir byte, idx uint64, b *[chunkLen]byte) {
	tag := uint64(dir)<<56 | idx
	h := mix(id*0x9e3779b97f4a7c15 ^ tag)
	binary.LittleEndian.PutUint64(b[0:], id)
	binary.LittleEndian.PutUint64(b[8:], tag)
	binary.LittleEndian.PutUint64(b[16:], h)
	binary.LittleEndian.PutUint64(b[24:], mix(h))
}

// fill writes the stream's bytes from offset off into p.
func fill(id uint64, dir byte, off int64, p []byte) {
	var b [chunkLen]byte
	for len(p) > 0 {
		idx, in := uint64(off/chunkLen), int(off%chunkLen)
		chunk(id, dir, idx, &b)
		n := copy(p, b[in:])
		p, off = p[n:], off+int64(n)
	}
}

// parseChunk reports whether p (at least chunkLen bytes) starts with a
// valid chunk, and whose.
func parseChunk(p []byte) (id uint64, dir byte, idx uint64, ok bool) {
	if len(p) < chunkLen {
		return 0, 0, 0, false
	}
	id = binary.LittleEndian.Uint64(p)
	tag := binary.LittleEndian.Uint64(p[8:])
	var b [chunkLen]byte
	chunk(id, byte(tag>>56), tag&(1<<56-1), &b)
	if string(b[:]) != string(p[:chunkLen]) {
		return 0, 0, 0, false
	}
	return id, byte(tag >> 56), tag & (1<<56 - 1), true
}

// verifier checks a received stream byte by byte as it arrives.
type verifier struct {
	id  uint64
	dir byte
	n   int64  // bytes received and found right
	crc uint32 // of those bytes
	bad *mismatch
	b   [chunkLen]byte
	bi  int64 // the chunk in b; -1 none

	// The sender's urgent byte (MSG_OOB), sent after oobAt bytes of the
	// stream (-1 none): a proxy may drop it (the socket's default) or pass
	// it on in the stream (SO_OOBINLINE), exactly there. Its value is never
	// the stream's byte at that offset, so it is told apart.
	oobAt     int64
	oobInline bool // it came, in the stream
}

// oobByte is the urgent byte sent after off bytes of a stream.
func oobByte(id uint64, dir byte, off int64) byte {
	var b [chunkLen]byte
	chunk(id, dir, uint64(off/chunkLen), &b)
	return ^b[off%chunkLen]
}

// mismatch is the first wrong byte of a stream.
type mismatch struct {
	off     int64
	foreign uint64 // another connection's id whose chunk was found there; 0 if none
	what    string
}

func newVerifier(id uint64, dir byte, oobAt int64) *verifier {
	return &verifier{id: id, dir: dir, bi: -1, oobAt: oobAt}
}

// write checks p, the next bytes of the stream; after the first mismatch
// it records nothing more.
func (v *verifier) write(p []byte) {
	if v.bad != nil {
		return
	}
	q := p
	for len(q) > 0 {
		if v.n == v.oobAt && !v.oobInline && q[0] == oobByte(v.id, v.dir, v.n) {
			v.oobInline = true
			q = q[1:]
			continue
		}
		idx, in := v.n/chunkLen, int(v.n%chunkLen)
		if idx != v.bi {
			chunk(v.id, v.dir, uint64(idx), &v.b)
			v.bi = idx
		}
		want := v.b[in:]
		k := min(len(want), len(q))
		if v.oobAt > v.n && !v.oobInline {
			k = int(min(int64(k), v.oobAt-v.n)) // stop where the urgent byte may be
		}
		if string(want[:k]) != string(q[:k]) {
			i := 0
			for want[i] == q[i] {
				i++
			}
			v.crc = crc32.Update(v.crc, castagnoli, q[:i])
			v.n += int64(i)
			v.bad = v.explain(p, len(p)-len(q)+i)
			return
		}
		v.crc = crc32.Update(v.crc, castagnoli, q[:k])
		v.n += int64(k)
		q = q[k:]
	}
}

// explain looks for a whole chunk around p[at], the first wrong byte.
func (v *verifier) explain(p []byte, at int) *mismatch {
	m := &mismatch{off: v.n}
	for s := max(0, at-chunkLen+1); s+chunkLen <= len(p) && s <= at+chunkLen; s++ {
		if id, dir, idx, ok := parseChunk(p[s:]); ok {
			if id != v.id {
				m.foreign = id
				m.what = fmt.Sprintf("a chunk of connection %d (dir %d, chunk %d) at offset %d", id, dir, idx, v.n-int64(at-s))
				return m
			}
			m.what = fmt.Sprintf("this connection's own chunk (dir %d, chunk %d) at offset %d: bytes lost, repeated or reordered", dir, idx, v.n-int64(at-s))
			return m
		}
	}
	lo, hi := max(0, at-8), min(len(p), at+24)
	m.what = fmt.Sprintf("byte %#02x where %#02x belongs; received around it: % x", p[at], v.want(v.n), p[lo:hi])
	return m
}

func (v *verifier) want(off int64) byte {
	var b [chunkLen]byte
	chunk(v.id, v.dir, uint64(off/chunkLen), &b)
	return b[off%chunkLen]
}

// crcOf is the checksum of the stream's first n bytes, as its sender sent them.
func crcOf(id uint64, dir byte, n int64) uint32 {
	var c uint32
	buf := make([]byte, 64<<10)
	for off := int64(0); off < n; {
		k := min(int64(len(buf)), n-off)
		fill(id, dir, off, buf[:k])
		c = crc32.Update(c, castagnoli, buf[:k])
		off += k
	}
	return c
}
