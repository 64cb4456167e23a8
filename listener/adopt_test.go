package listener

import (
	"bufio"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// TestExportAdopt: a second Server (the new process) adopts the sockets a
// first one exports under their configured address, port 0 included; both
// accept until the first closes, and a connection queued meanwhile is
// served by the second. The export leaves the first's socket non-blocking
// even after its File's Fd is taken (what os.StartProcess does). An
// adopted socket no listener wants is closed by CloseUnadopted; one that is
// used is the new Server's own: a reload that removes it closes it.
func TestExportAdopt(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Greeter("a"))
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil)
	key := netip.MustParseAddrPort("127.0.0.1:0")
	spareLn, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	spare, err := p.srv.Inherit(spareLn) // passed by systemd, not configured; Inherit closes spareLn, keeping its socket
	if err != nil {
		t.Fatal(err)
	}

	exp, err := p.srv.Export()
	if err != nil {
		t.Fatal(err)
	}
	if len(exp) != 2 {
		t.Fatalf("Export() = %d sockets; want 2", len(exp))
	}
	next := New(zerolog.Nop())
	next.Publish(p.srv.Snapshot())                    // the new process's first snapshot, as its reload would publish
	dropped := netip.MustParseAddrPort("127.0.0.2:1") // the key the spare is adopted under
	for _, e := range exp {
		if fl, _ := unix.FcntlInt(e.File.Fd(), unix.F_GETFL, 0); fl&unix.O_NONBLOCK == 0 { // Fd: as os.StartProcess does
			t.Errorf("Fd of the exported %v cleared O_NONBLOCK, which the exporting Server's socket shares", e.Key)
		}
		fl, err := net.FileListener(e.File)
		e.File.Close()
		if err != nil {
			t.Fatal(err)
		}
		switch e.Key {
		case key:
			if e.Inherited {
				t.Errorf("the bound socket exported as inherited")
			}
			if err := next.Adopt(e.Key, fl.(*net.TCPListener)); err != nil {
				t.Fatal(err)
			}
		case spare:
			if !e.Inherited {
				t.Errorf("the socket from systemd exported as not inherited")
			}
			if err := next.Adopt(dropped, fl.(*net.TCPListener)); err != nil { // a key the new configuration lacks
				t.Fatal(err)
			}
		default:
			t.Fatalf("exported %v", e.Key)
		}
	}
	ch, err := next.Prepare([]netip.AddrPort{key}, false)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	if got, want := next.Addr(key).String(), p.addr; got != want {
		t.Fatalf("the new Server serves %s on %s; want the adopted %s", key, got, want)
	}
	if closed := next.CloseUnadopted(); len(closed) != 1 {
		t.Errorf("CloseUnadopted() = %v; want the unused socket", closed)
	}
	next.mu.Lock()
	_, kept := next.spare[dropped]
	next.mu.Unlock()
	if kept {
		t.Error("the unused adopted socket is still kept") // and CheckLeaks finds it open if it was not closed
	}

	greet := func(c net.Conn) string {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	for range 10 { // both accept: every connection is served by one or the other
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := greet(c); got != "a\n" {
			t.Fatalf("during the overlap: %q", got)
		}
		c.Close()
	}
	p.srv.Close() // the old process drains
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatalf("after the old Server closed: %v", err)
	}
	if got := greet(c); got != "a\n" {
		t.Errorf("after the old Server closed: %q", got)
	}
	c.Close()

	p.store(sched.NewTable(3, nil, nil))
	ch, err = next.Prepare(nil, false) // a reload removes the address: the adopted socket is ours to close
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		c.Close()
		t.Error("the adopted socket is still open after a reload removed its address")
	}
	next.Close()
	next.Wait()
}
