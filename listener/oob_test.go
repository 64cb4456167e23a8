package listener

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// TestUrgentData (C4): a peer that sends urgent data (MSG_OOB: telnet's
// interrupt, FTP's ABOR) gets every byte across, the urgent one in the
// stream as an ordinary byte, in either direction and whichever way the
// proxy copies. Reads stop at the urgent mark and splice never passes it:
// the direction must neither stall there nor take the splice's 0 at the
// peer's FIN for the end while bytes wait behind the mark.
//
// The sender corks its socket, so that the bytes before the mark, the
// urgent byte and the bytes behind it are queued together at the proxy.
//
// The client connects to a plain TCP listening socket, as systemd passes
// one: Go's Listen makes a Multipath TCP socket where the kernel has it,
// which takes no SO_OOBINLINE (setNoDelay), and on such a listener the
// client's urgent byte is not part of the stream (the "mptcp" case: every
// other byte arrives, and the stream does not stall or end early).
func TestUrgentData(t *testing.T) {
	for _, mode := range []copyMode{copyBuffer, copySplice, copyAuto} {
		for _, dir := range []string{"up", "down", "mptcp"} {
			for _, fin := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%s/fin=%v", mode, dir, fin), func(t *testing.T) { testUrgentData(t, mode, dir, fin) })
			}
		}
	}
}

// tcpListener is a plain TCP listening socket on 127.0.0.1, as systemd
// passes one (never Multipath TCP).
func tcpListener(t *testing.T) *net.TCPListener {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return ln.(*net.TCPListener)
}

func testUrgentData(t *testing.T, mode copyMode, dir string, fin bool) {
	testkit.CheckLeaks(t)
	bulk := 0
	if mode != copyBuffer {
		bulk = 64 << 10 // full reads: auto switches to splice before the mark
	}
	sent := append(bytes.Repeat([]byte{'x'}, bulk), "AAAAUBBBB"...)
	var wantp atomic.Pointer[[]byte] // set below, once the listener is known; the backend reads it
	// send writes sent through c with the U as urgent data.
	send := func(c *net.TCPConn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 1) })
		if serr != nil {
			return serr
		}
		if _, err := c.Write(sent[:bulk+4]); err != nil {
			return err
		}
		rc.Control(func(fd uintptr) { serr = unix.Sendto(int(fd), sent[bulk+4:bulk+5], unix.MSG_OOB, nil) })
		if serr != nil {
			return serr
		}
		if _, err := c.Write(sent[bulk+5:]); err != nil {
			return err
		}
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 0) })
		if serr == nil && fin {
			serr = c.CloseWrite()
		}
		return serr
	}
	// recv reads what c gets: to EOF with a FIN, else as many bytes as sent.
	recv := func(c *net.TCPConn) ([]byte, error) {
		want := *wantp.Load()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if fin {
			return io.ReadAll(testkit.User(c))
		}
		got := make([]byte, len(want))
		n, err := io.ReadFull(testkit.User(c), got)
		return got[:n], err
	}
	type result struct {
		b   []byte
		err error
	}
	at := make(chan result, 1)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		if dir != "down" {
			b, err := recv(c)
			at <- result{b, err}
			return
		}
		at <- result{nil, send(c)}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, testkit.User(c)) // until the client closes
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withMode(mode))
	if dir != "mptcp" { // a plain TCP listener, as systemd's
		a, err := p.srv.Inherit(tcpListener(t))
		if err != nil {
			t.Fatal(err)
		}
		base := netip.MustParseAddrPort("127.0.0.1:0")
		p.store(sched.NewTable(2, []*sched.Service{p.svc}, map[netip.AddrPort]*sched.Service{base: p.svc, a: p.svc}))
		ch, err := p.srv.Prepare([]netip.AddrPort{base, a}, false)
		if err != nil {
			t.Fatal(err)
		}
		ch.Commit()
		p.addr = p.srv.Addr(a).String()
	}
	want := sent
	if dir == "mptcp" && !oobInline(p) {
		want = slices.Delete(slices.Clone(sent), bulk+4, bulk+5) // the kernel's way: the urgent byte is not in the stream
	}
	wantp.Store(&want)
	c := p.dial(t)
	var got []byte
	var err error
	if dir != "down" {
		if err := send(c); err != nil {
			t.Fatalf("send: %v", err)
		}
		r := <-at
		got, err = r.b, r.err
	} else {
		got, err = recv(c)
		if r := <-at; r.err != nil {
			t.Fatalf("send: %v", r.err)
		}
	}
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("got %d of %d bytes (%v), ending %q; want all, ending %q", len(got), len(want), err,
			got[max(0, len(got)-9):], want[max(0, len(want)-9):])
	}
	c.Close()
	p.settle(t, 0)
}

// oobInline reports whether p's own listening socket has SO_OOBINLINE.
func oobInline(p *testProxy) bool {
	p.srv.mu.Lock()
	defer p.srv.mu.Unlock()
	for _, so := range p.srv.lns {
		v := 0
		v, _ = unix.GetsockoptInt(so.a.fd, unix.SOL_SOCKET, unix.SO_OOBINLINE)
		return v == 1
	}
	return false
}
