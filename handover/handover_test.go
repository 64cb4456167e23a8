package handover

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"fulcrum/listener"
	"fulcrum/systemd"
)

// fakeSD is the service manager: it passes socks, records what it is told,
// and keeps an fd store of names when storeMax > 0.
type fakeSD struct {
	socks    []systemd.Socket
	ready    func() error // UpgradeReady's answer
	storeMax int

	mu       sync.Mutex
	sent     []string
	stored   []string
	unstored []string
}

func (f *fakeSD) Listeners() ([]systemd.Socket, error) { return f.socks, nil }
func (f *fakeSD) UpgradeReady() func() error           { return f.ready }
func (f *fakeSD) FDStoreMax() int                      { return f.storeMax }

func (f *fakeSD) Notify(state string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, state)
	return true, nil
}

func (f *fakeSD) Store(name string, _ *os.File) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stored = append(f.stored, name)
	return true, nil
}

func (f *fakeSD) Unstore(name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unstored = append(f.unstored, name)
	return true, nil
}

func (f *fakeSD) messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent)
}

// listen binds a loopback listening socket, closed when the test ends
// unless the Server took it.
func listen(t *testing.T) (*net.TCPListener, netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	tl := ln.(*net.TCPListener)
	return tl, tl.Addr().(*net.TCPAddr).AddrPort()
}

func newServer(t *testing.T) *listener.Server {
	srv := listener.New(zerolog.Nop())
	t.Cleanup(func() { srv.Close(); srv.Wait() })
	return srv
}

// TestNew: the sockets passed in are sorted by their names: fulcrum's own
// are adopted under the address the name carries, an admin socket is kept
// only for the admin address still configured, and systemd's keep their
// FileDescriptorName= for reload.
func TestNew(t *testing.T) {
	own, ownKey := listen(t)
	adm, admKey := listen(t)
	stale, staleKey := listen(t)
	pg1, pg1Addr := listen(t)
	pg2, pg2Addr := listen(t)
	anon, _ := listen(t)
	sd := &fakeSD{socks: []systemd.Socket{
		{Name: encodeKey(listenPrefix, ownKey), Listener: own},
		{Name: encodeKey(adminPrefix, staleKey), Listener: stale}, // [admin] listen changed in between
		{Name: encodeKey(adminPrefix, admKey), Listener: adm},
		{Name: "pg", Listener: pg1},
		{Name: "pg", Listener: pg2},
		{Name: "", Listener: anon},
	}}
	srv := newServer(t)
	u, err := New(srv, sd, admKey, zerolog.Nop(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := u.Sockets(), map[string][]netip.AddrPort{"pg": {pg1Addr, pg2Addr}}; len(got) != 1 || !slices.Equal(got["pg"], want["pg"]) {
		t.Errorf("Sockets() = %v; want %v", got, want)
	}
	ln, err := u.ListenAdmin()
	if err != nil {
		t.Fatal(err)
	}
	if ln != adm {
		t.Errorf("ListenAdmin() = %v; want the admin listener passed in (%v)", ln.Addr(), admKey)
	}
	if _, err := stale.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the admin socket for %v (no longer configured): Accept = %v; want it closed", staleKey, err)
	}
	exp, err := srv.Export()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range exp {
		keys = append(keys, e.Key.String())
		e.File.Close()
	}
	slices.Sort(keys)
	if len(keys) != 4 || !slices.Contains(keys, ownKey.String()) {
		t.Errorf("the Server holds %v; want the adopted %v and the three of systemd's", keys, ownKey)
	}
}

// TestUpgrade: a start that fails leaves this process serving and telling
// systemd as before; one that succeeds hands over: the sockets go under
// their names, OnServe runs before MAINPID=, Done delivers the pid,
// nothing more reaches systemd, and a second upgrade is refused.
func TestUpgrade(t *testing.T) {
	own, ownKey := listen(t)
	sysd, sysdAddr := listen(t)
	sd := &fakeSD{socks: []systemd.Socket{
		{Name: encodeKey(listenPrefix, ownKey), Listener: own},
		{Name: "pg", Listener: sysd},
	}}
	var served []string // the messages systemd had when OnServe ran
	u, err := New(newServer(t), sd, netip.AddrPort{}, zerolog.Nop(), Options{OnServe: func() { served = sd.messages() }})
	if err != nil {
		t.Fatal(err)
	}
	u.start = func([]systemd.Passed) (int, error) { return 0, errors.New("exited with status 1") }
	if pid, err := u.Upgrade(); err == nil || pid != 0 {
		t.Fatalf("Upgrade with a failing binary = %d, %v; want an error", pid, err)
	}
	if err := u.Notify(systemd.Ready); err != nil {
		t.Fatal(err)
	}
	if got := sd.messages(); !slices.Equal(got, []string{systemd.Ready}) || served != nil {
		t.Errorf("after a failed upgrade systemd got %q (OnServe ran: %v); want READY=1 alone", got, served != nil)
	}

	var passed []string
	u.start = func(socks []systemd.Passed) (int, error) {
		for _, s := range socks {
			passed = append(passed, s.Name)
		}
		return 4242, nil
	}
	pid, err := u.Upgrade()
	if err != nil || pid != 4242 {
		t.Fatalf("Upgrade = %d, %v; want 4242", pid, err)
	}
	slices.Sort(passed)
	if want := []string{encodeKey(listenPrefix, ownKey), "pg"}; !slices.Equal(passed, want) {
		t.Errorf("sockets handed over: %q; want %q (systemd's %v under its name)", passed, want, sysdAddr)
	}
	if served == nil || len(served) != 1 {
		t.Errorf("OnServe saw %q; want it called before MAINPID=", served)
	}
	select {
	case got := <-u.Done():
		if got != 4242 {
			t.Errorf("Done() = %d; want 4242", got)
		}
	default:
		t.Error("Done() has nothing after a hand-over")
	}
	got := sd.messages()
	if len(got) != 2 || !strings.HasPrefix(got[1], "MAINPID=4242\nSTATUS=upgraded: pid 4242 serves") {
		t.Errorf("systemd got %q; want MAINPID=4242 last", got)
	}
	if err := u.Notify(systemd.Ready); err != nil {
		t.Fatal(err)
	}
	if n := len(sd.messages()); n != 2 {
		t.Errorf("Notify after the hand-over reached systemd (%d messages); want nothing sent", n)
	}
	if _, err := u.Upgrade(); !errors.Is(err, ErrHandedOver) {
		t.Errorf("second Upgrade = %v; want ErrHandedOver", err)
	}
}

// TestNotifyStartedByUpgrade: in a process an upgrade started, the first
// READY=1 goes to the old process (and closes the adopted sockets no
// listener took), every later one to systemd.
func TestNotifyStartedByUpgrade(t *testing.T) {
	unused, unusedKey := listen(t)
	readies := 0
	sd := &fakeSD{socks: []systemd.Socket{{Name: encodeKey(listenPrefix, unusedKey), Listener: unused}},
		ready: func() error { readies++; return nil }}
	u, err := New(newServer(t), sd, netip.AddrPort{}, zerolog.Nop(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Notify(systemd.Reloading()); err != nil { // before READY: systemd's, as in any process
		t.Fatal(err)
	}
	for range 2 {
		if err := u.Notify(systemd.Ready + "\n" + systemd.Status("gen 1")); err != nil {
			t.Fatal(err)
		}
	}
	if readies != 1 {
		t.Errorf("the old process was told %d times; want once", readies)
	}
	if got := sd.messages(); len(got) != 2 || !strings.HasPrefix(got[0], "RELOADING=1") || !strings.HasPrefix(got[1], systemd.Ready) {
		t.Errorf("systemd got %q; want RELOADING=1, then the second READY=1 only", got)
	}
	if _, err := unused.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("an adopted socket no listener took: Accept = %v; want it closed at READY=1", err)
	}
}

// TestFDStore: at READY=1 the store is made to hold exactly the sockets this
// process bound: those it adopted from the store stay, systemd's own are
// never stored, and a name the configuration no longer uses is removed.
func TestFDStore(t *testing.T) {
	own, ownKey := listen(t)
	stale, staleKey := listen(t)
	sysd, _ := listen(t)
	sd := &fakeSD{storeMax: 16, socks: []systemd.Socket{
		{Name: encodeKey(listenPrefix, ownKey), Listener: own},
		{Name: encodeKey(adminPrefix, staleKey), Listener: stale}, // no [admin] listen now
		{Name: "pg", Listener: sysd},
	}}
	u, err := New(newServer(t), sd, netip.AddrPort{}, zerolog.Nop(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Notify(systemd.Ready); err != nil {
		t.Fatal(err)
	}
	if len(sd.stored) != 0 || !slices.Equal(sd.unstored, []string{encodeKey(adminPrefix, staleKey)}) {
		t.Errorf("stored %q, removed %q; want nothing stored (the adopted one is there) and the stale admin name removed", sd.stored, sd.unstored)
	}
}
