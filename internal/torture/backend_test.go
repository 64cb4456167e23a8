package torture

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pires/go-proxyproto"
)

// tbackend is one of the harness's backends: it accepts, learns the
// connection's id from its first chunk (after a PROXY header or a
// ClientHello where its service sends one), derives the connection's plan
// from the seed and plays its side of it, checking every byte it receives.
// kill closes its listener and resets every connection; start listens
// again on the same address.
type tbackend struct {
	h     *harness
	name  string
	svc   string
	addr  string
	idx   uint64
	greet bool   // speaks first: a 64-byte greeting tagged with the accept's own id
	pp    bool   // fulcrum sends it a PROXY v2 header
	hello []byte // the ClientHello its clients send first; nil if none

	seq atomic.Uint64 // accepts

	mu    sync.Mutex // protects ln, conns
	ln    *net.TCPListener
	conns map[*net.TCPConn]bool
	wg    sync.WaitGroup // accept loops and handlers
}

const greetLen = 64

func (b *tbackend) start() error {
	a, err := net.ResolveTCPAddr("tcp", b.addr)
	if err != nil {
		return err
	}
	ln, err := net.ListenTCP("tcp", a)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.ln = ln
	if b.conns == nil {
		b.conns = map[*net.TCPConn]bool{}
	}
	b.mu.Unlock()
	b.wg.Add(1)
	go func() { // exits when kill or close closes ln
		defer b.wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns[c] = true
			b.mu.Unlock()
			b.wg.Add(1)
			go func() { // exits when the connection's plan is played out or it fails
				defer b.wg.Done()
				b.serve(c)
				b.mu.Lock()
				delete(b.conns, c)
				b.mu.Unlock()
			}()
		}
	}()
	return nil
}

// kill closes the listener and resets every open connection.
func (b *tbackend) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln != nil {
		b.ln.Close()
		b.ln = nil
	}
	for c := range b.conns {
		c.SetLinger(0)
		c.Close()
	}
}

// open is how many connections the backend holds now.
func (b *tbackend) open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.conns)
}

// beResult is what a backend saw of one connection.
type beResult struct {
	backend   string
	accept    uint64 // the accept's own id (greeting)
	upN       int64  // bytes received right
	upCRC     uint32
	upEOF     bool // the stream ended with a FIN
	upErr     error
	downN     int64 // bytes sent
	downCRC   uint32
	downErr   error
	bad       *mismatch
	proxySrc  string // the source a PROXY header carried
	oobInline bool   // the client's urgent byte came in the stream
	problems  []string
	start     time.Time
	end       time.Time
	idAt      time.Time // the id had come: the backend began to write
	wrote     time.Time // its writes had all returned
	upEnd     time.Time // the up stream had ended
	downMarks []wmark   // timed service: when its writes ended (writeStream)
	timed     bool
}

func (r *beResult) marks() *[]wmark {
	if !r.timed {
		return nil
	}
	return &r.downMarks
}

func (b *tbackend) serve(c *net.TCPConn) {
	h := b.h
	acc := 1<<48 | b.idx<<32 | b.seq.Add(1)
	r := &beResult{backend: b.name, accept: acc, start: time.Now()}
	if b.greet {
		var g [greetLen]byte
		fill(acc, dirGreet, 0, g[:])
		c.SetWriteDeadline(time.Now().Add(h.stallLimit))
		if _, err := c.Write(g[:]); err != nil {
			h.anon.Add(1)
			return
		}
	}
	dr := &deadlineReader{c, h.stallLimit, newProgress()} // the connection's own once its id is known
	br := bufio.NewReaderSize(dr, 32<<10)
	if b.pp {
		hdr, err := proxyproto.Read(br)
		if err != nil {
			h.anon.Add(1) // a health check, or a session ended before its header
			return
		}
		if ap, ok := hdr.SourceAddr.(*net.TCPAddr); ok {
			r.proxySrc = ap.IP.String()
		}
	}
	if b.hello != nil {
		got := make([]byte, len(b.hello))
		if n, err := io.ReadFull(br, got); err != nil {
			if n > 0 {
				h.note(fmt.Sprintf("backend %s: the ClientHello ended after %d of %d bytes: %v", b.name, n, len(b.hello), err))
			}
			h.anon.Add(1)
			return
		} else if string(got) != string(b.hello) {
			h.fail(classMisrouted, 0, fmt.Sprintf("backend %s (service %s) got a ClientHello not its service's (first bytes % x)", b.name, b.svc, got[:min(48, len(got))]))
			return
		}
	}
	var first [8]byte
	if _, err := io.ReadFull(br, first[:]); err != nil {
		h.anon.Add(1) // a health check, or a session cut before its first byte
		return
	}
	r.idAt = time.Now()
	id := binary.LittleEndian.Uint64(first[:])
	p := h.plan(id)
	if p == nil {
		h.fail(classForeign, 0, fmt.Sprintf("backend %s got a stream that starts with %x: no connection's id", b.name, first))
		return
	}
	if !h.claim(id, r) {
		return // claim reported it
	}
	dr.p = p.prog
	r.timed = p.svc.timed
	if p.svc.name != b.svc {
		r.problems = append(r.problems, fmt.Sprintf("misrouted: a client of service %s reached backend %s of service %s", p.svc.name, b.name, b.svc))
	}
	if b.pp && r.proxySrc != p.clientIP.String() {
		r.problems = append(r.problems, fmt.Sprintf("PROXY header carried source %s; the client sent %s", r.proxySrc, p.clientIP))
	}
	v := newVerifier(id, dirUp, p.cliOOB)
	v.write(first[:])
	upDone := make(chan struct{})
	rst := &resetOnce{c: c}
	go func() { // exits at the stream's end or error: the reader
		defer close(upDone)
		r.upEOF, r.upErr = readStream(br, v, p.beSlow, p.beStall, p.rstBackendUp, rst, p.rng(3), p.svc.timed)
		r.upEnd = time.Now()
	}()
	// The writer.
	r.downN, r.downCRC, r.downErr = writeStream(c, id, dirDown, p.down, p.beOOB, p.rstBackendDown, p.tiny, rst, p.rng(4), p.limit, p.prog, r.marks())
	r.wrote = time.Now()
	if r.downErr == nil {
		if p.order == clientFirst {
			<-upDone
		}
		if !rst.done() {
			c.CloseWrite()
		}
	}
	<-upDone
	r.upN, r.upCRC, r.bad, r.oobInline = v.n, v.crc, v.bad, v.oobInline
	c.Close()
	h.beDone(id, r)
}

// progress is when a connection last moved a byte, either way at either
// end (unix nanoseconds): it has stalled when nothing moved for the plan's
// limit. One direction, or one end, may wait legitimately for as long as
// the rest takes (the half-close orders; bytes the proxy holds for a slow
// reader at the other end).
type progress struct{ at atomic.Int64 }

func newProgress() *progress {
	p := &progress{}
	p.moved()
	return p
}

func (p *progress) moved() { p.at.Store(time.Now().UnixNano()) }

// stalled reports whether nothing moved for d.
func (p *progress) stalled(d time.Duration) bool {
	return time.Since(time.Unix(0, p.at.Load())) >= d
}

// deadlineReader reads with a deadline, and reads again when the deadline
// passes while the other direction still moves.
type deadlineReader struct {
	c *net.TCPConn
	d time.Duration
	p *progress
}

func (r *deadlineReader) Read(b []byte) (int, error) {
	for {
		r.c.SetReadDeadline(time.Now().Add(r.d))
		n, err := r.c.Read(b)
		if n > 0 {
			r.p.moved()
		}
		if n == 0 && isTimeout(err) && !r.p.stalled(r.d) {
			continue
		}
		return n, err
	}
}

// resetOnce resets its connection (SO_LINGER 0, close) once.
type resetOnce struct {
	c    *net.TCPConn
	once sync.Once
	did  atomic.Bool
}

func (r *resetOnce) reset() {
	r.once.Do(func() {
		r.did.Store(true)
		r.c.SetLinger(0)
		r.c.Close()
	})
}

func (r *resetOnce) done() bool { return r.did.Load() }

var errStalled = errors.New("stalled")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// keyOf is the access line key of a client address: its IP.
func keyOf(a netip.Addr) string { return a.String() }
