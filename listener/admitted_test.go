package listener

import (
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestAdmitted: Admitted is closed while nothing is being admitted, stays
// open while an accepted connection reads its PROXY header, even after
// Close (the connection was accepted before), and closes once that
// connection is a session; the session is then served.
func TestAdmitted(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{name: "a", addr: be.Addr, weight: 1}}, func(s tuned) {
		s.AcceptProxy = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		s.ProxyTimeout = 30 * time.Second
	})
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	if !closed(p.srv.Admitted()) {
		t.Fatal("Admitted is open with no connection")
	}
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	hdr := "PROXY TCP4 127.0.0.9 127.0.0.1 40000 5432\r\n"
	if _, err := io.WriteString(c, hdr[:10]); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, func() error {
		if n := p.srv.Sockets()[0].Accepts; n != 1 {
			return fmt.Errorf("%d connections accepted; want 1", n)
		}
		return nil
	})
	adm := p.srv.Admitted()
	p.srv.Close()
	if closed(adm) {
		t.Fatal("Admitted is closed while an accepted connection reads its PROXY header")
	}
	if _, err := io.WriteString(c, hdr[10:]+"ping"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-adm:
	case <-time.After(10 * time.Second):
		t.Fatal("Admitted not closed within 10s of the header's end")
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("read %q, %v; want the echo of ping", b, err)
	}
	if n := p.svc.Targets[0].B.Active(); n != 1 {
		t.Errorf("backend has %d active when Admitted closes; want the session's 1", n)
	}
}
