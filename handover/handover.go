// Package handover is the binary upgrade: the running daemon starts the
// binary now installed at its own path, hands over every listening socket
// (and the admin one), waits until the new process serves, makes it
// systemd's main process (MAINPID=) and then drains and exits. Both
// processes accept from the same sockets during the overlap, so no
// connection is refused or reset. A new binary that fails to start, exits
// or is not ready within Timeout is stopped, and this one serves on as if
// nothing had happened. In fulcrum, "hand over" means this.
//
// It is also the one home of the listening sockets' names: a new process
// takes its sockets here, whether systemd passed them (socket activation:
// FileDescriptorName= names them, and Sockets tells reload which service
// each belongs to), a previous fulcrum handed them over, or systemd's file
// descriptor store kept them across a restart.
//
// Typical use: see Example (main does this).
//
// Ownership: New gives every listening socket to the Server, which closes
// them; the admin listener returned by ListenAdmin is the caller's. The
// Upgrader starts no goroutine of its own.
package handover

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/listener"
	"fulcrum/systemd"
)

// Timeout bounds how long the new process may take to load its
// configuration, resolve its backends and bind: above reload's resolve
// timeout, below systemd's WatchdogSec= in the unit.
const Timeout = 20 * time.Second

// Names of the sockets this process bound itself, in LISTEN_FDNAMES: the
// prefix, then the configured address with ':' written as '_' (a name may
// not hold ':'). Sockets systemd passed keep systemd's names.
const (
	listenPrefix = "fulcrum.listen."
	adminPrefix  = "fulcrum.admin."
)

func encodeKey(prefix string, a netip.AddrPort) string {
	return prefix + strings.ReplaceAll(a.String(), ":", "_")
}

// decodeKey parses a name made by encodeKey with prefix.
func decodeKey(prefix, name string) (netip.AddrPort, bool) {
	s, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return netip.AddrPort{}, false
	}
	a, err := netip.ParseAddrPort(strings.ReplaceAll(s, "_", ":"))
	return a, err == nil
}

// Notifier is the service manager as the hand-over uses it:
// *systemd.Notifier in the daemon, a fake in tests.
type Notifier interface {
	Listeners() ([]systemd.Socket, error)
	UpgradeReady() func() error
	Notify(state string) (bool, error)
	FDStoreMax() int
	Store(name string, f *os.File) (bool, error)
	Unstore(name string) (bool, error)
}

// Options are an Upgrader's settings; the zero value is valid.
type Options struct {
	// OnServe, if not nil, is called once the new process serves, before
	// MAINPID=: this process stops writing what the new one now owns (the
	// state file).
	OnServe func()
}

// Upgrader performs upgrades for the admin listener's POST /upgrade, and
// tells systemd (or the process that started this one) what reload says.
type Upgrader struct {
	srv   *listener.Server
	sd    Notifier
	log   zerolog.Logger
	opt   Options
	names map[netip.AddrPort]string // systemd's names for the sockets it passed
	named map[string][]netip.AddrPort
	// ready, when an upgrade started this process, tells the old process
	// that this one serves (systemd.Notifier.UpgradeReady); nil otherwise.
	ready     func() error
	readyOnce sync.Once
	adminKey  netip.AddrPort   // [admin] listen as configured; invalid: none
	passed    *net.TCPListener // the admin listener handed over by the previous process; nil if none
	// start runs the new binary with socks and returns its pid once it
	// serves; tests replace it.
	start func(socks []systemd.Passed) (int, error)

	mu     sync.Mutex       // serialises upgrades and store syncs; protects done, stored and admin
	done   bool             // handed over: this process is draining
	stored map[string]bool  // names in systemd's fd store, when it keeps one (syncStore)
	admin  *net.TCPListener // the admin listener to hand over; nil without one
	// served receives the new process's pid once, when it serves. Buffered 1.
	served chan int
	// handedOver is set with done, for Notify, which must not take mu.
	handedOver atomic.Bool
}

// New takes the sockets passed to this process (sd.Listeners): those a
// previous fulcrum handed over or systemd's fd store kept are adopted by
// srv under the addresses their names carry, systemd's own are inherited
// under their FileDescriptorName= (see Sockets), and an admin listener
// still bound to admin is kept for ListenAdmin (else closed). It also
// learns whether an upgrade started this process, whose first READY=1 then
// goes to the old process (Notify).
func New(srv *listener.Server, sd Notifier, admin netip.AddrPort, log zerolog.Logger, opt Options) (*Upgrader, error) {
	u := &Upgrader{srv: srv, sd: sd, log: log, opt: opt, adminKey: admin, names: map[netip.AddrPort]string{},
		named: map[string][]netip.AddrPort{}, stored: map[string]bool{}, served: make(chan int, 1)}
	u.start = u.startBinary
	socks, err := sd.Listeners()
	if err != nil {
		return nil, err
	}
	u.ready = sd.UpgradeReady() // after Listeners, which reads its variable
	for _, so := range socks {
		if a, ok := decodeKey(listenPrefix, so.Name); ok {
			u.stored[so.Name] = true // if it came from the fd store, it is there; syncStore removes it if need be
			if err := srv.Adopt(a, so.Listener); err != nil {
				return nil, fmt.Errorf("adopt the socket of %s: %w", a, err)
			}
			log.Info().Stringer("listen", a).Msg("socket adopted from the previous process")
			continue
		}
		if a, ok := decodeKey(adminPrefix, so.Name); ok {
			u.stored[so.Name] = true
			if a == admin && u.passed == nil {
				u.passed = so.Listener
			} else {
				so.Listener.Close() // [admin] listen changed in between
			}
			continue
		}
		a, err := srv.Inherit(so.Listener)
		if err != nil {
			return nil, fmt.Errorf("take the socket systemd passed (%s): %w", so.Listener.Addr(), err)
		}
		u.names[a] = so.Name
		log.Info().Stringer("addr", a).Str("name", so.Name).Msg("socket passed by systemd")
		if so.Name != "" {
			u.named[so.Name] = append(u.named[so.Name], a)
		}
	}
	return u, nil
}

// Sockets names the listening sockets systemd passed (FileDescriptorName=
// → addresses): a service of that name also listens on them, whatever its
// listen list says (reload.Options.Sockets). Nil when none is named.
func (u *Upgrader) Sockets() map[string][]netip.AddrPort {
	if len(u.named) == 0 {
		return nil
	}
	return u.named
}

// ListenAdmin returns the listener for [admin] listen: the one the previous
// process handed over, or else one bound now. It is handed over at the
// next upgrade; the caller closes it.
func (u *Upgrader) ListenAdmin() (*net.TCPListener, error) {
	ln := u.passed
	if ln == nil {
		l, err := net.Listen("tcp", u.adminKey.String())
		if err != nil {
			return nil, err
		}
		ln = l.(*net.TCPListener)
	}
	u.mu.Lock()
	u.admin = ln
	u.mu.Unlock()
	return ln, nil
}

// Done receives the new process's pid once it serves: this process then
// stops its admin listener (the new one answers on the same socket) and
// drains, telling systemd nothing more.
func (u *Upgrader) Done() <-chan int { return u.served }

// Notify is reload's notify: it sends state to systemd, but
//   - in a process an upgrade started, the first READY=1 goes to the old
//     process instead, which then sends MAINPID= (systemd takes no message
//     from this one before); every later one (after a reload's
//     RELOADING=1) goes to systemd, as in any process, or systemd would
//     hold the unit in "reloading" until its timeout;
//   - in a process that has handed over, nothing is sent: the new one is
//     systemd's main process now;
//   - with an fd store, each READY=1 first brings it up to date.
func (u *Upgrader) Notify(state string) error {
	if u.handedOver.Load() {
		return nil
	}
	ready := strings.HasPrefix(state, systemd.Ready)
	if ready && u.ready != nil {
		first, err := false, error(nil)
		u.readyOnce.Do(func() {
			first = true
			u.srv.CloseUnadopted()
			err = u.ready()
		})
		if first {
			if err == nil {
				u.log.Info().Msg("upgrade: told the old process that this one serves")
			}
			return err
		}
	}
	if ready {
		u.syncStore()
	}
	_, err := u.sd.Notify(state)
	return err
}

// ErrHandedOver refuses a second upgrade in a process that has handed over.
var ErrHandedOver = errors.New("this process has already handed over to a new one and is draining")

// Upgrade replaces this process and returns the new one's pid, or the
// reason it did not, in which case this process serves on.
func (u *Upgrader) Upgrade() (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return 0, ErrHandedOver
	}
	socks, err := u.sockets(true)
	if err != nil {
		err = fmt.Errorf("upgrade: %w", err)
	} else {
		var pid int
		pid, err = u.start(socks)
		for _, s := range socks {
			s.File.Close()
		}
		if err == nil {
			u.handOver(pid)
			return pid, nil
		}
	}
	u.log.Error().Err(err).Msg("upgrade failed; this process serves on")
	return 0, err
}

// handOver makes the new process, pid, the one that serves. Called with
// u.mu held.
func (u *Upgrader) handOver(pid int) {
	u.done = true
	u.handedOver.Store(true)
	if u.opt.OnServe != nil {
		u.opt.OnServe()
	}
	// This process's last message, and the one only it may send: under
	// NotifyAccess=main systemd takes MAINPID= from the main process alone.
	if _, err := u.sd.Notify(systemd.MainPID(pid) + "\n" + systemd.Status(fmt.Sprintf("upgraded: pid %d serves, pid %d drains", pid, os.Getpid()))); err != nil {
		u.log.Warn().Err(err).Msg("sd_notify failed")
	}
	u.log.Info().Int("pid", pid).Msg("upgrade: the new process serves; draining")
	u.served <- pid
}

// startBinary starts the binary now installed at this process's path with
// socks, and waits for it to serve.
func (u *Upgrader) startBinary(socks []systemd.Passed) (int, error) {
	exe, err := os.Executable() // re-resolved: the binary now installed at our path
	if err != nil {
		return 0, fmt.Errorf("upgrade: find the binary: %w", err)
	}
	u.log.Info().Str("binary", exe).Int("sockets", len(socks)).Msg("upgrade: starting the new process")
	p, err := systemd.Upgrade(exe, os.Args[1:], os.Environ(), socks, os.Stdout, os.Stderr, Timeout)
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	p.Release() // its next parent reaps it
	return pid, nil
}

// sockets duplicates the listening sockets to pass on, named for
// LISTEN_FDNAMES: those systemd passed (only withSystemd) under its names,
// the rest under encodeKey's, the admin listener's included. The caller
// closes the Files. Called with u.mu held.
func (u *Upgrader) sockets(withSystemd bool) ([]systemd.Passed, error) {
	exp, err := u.srv.Export()
	if err != nil {
		return nil, err
	}
	socks := make([]systemd.Passed, 0, len(exp)+1)
	for _, e := range exp {
		name := encodeKey(listenPrefix, e.Key)
		if e.Inherited {
			if !withSystemd {
				e.File.Close()
				continue
			}
			if name = u.names[e.Key]; name == "" {
				name = "unknown" // sd_listen_fds_with_names(3)'s word for no name
			}
		}
		socks = append(socks, systemd.Passed{Name: name, File: e.File})
	}
	if u.admin != nil {
		f, err := listener.Dup(u.admin)
		if err != nil {
			for _, s := range socks {
				s.File.Close()
			}
			return nil, fmt.Errorf("admin listener: %w", err)
		}
		socks = append(socks, systemd.Passed{Name: encodeKey(adminPrefix, u.adminKey), File: f})
	}
	return socks, nil
}

// syncStore makes systemd's file descriptor store (FileDescriptorStoreMax=)
// hold exactly the sockets this process bound, so that `systemctl restart`
// keeps them bound: connections queue while the old process drains and the
// new one starts, and none is refused unless the backlog overflows. Sockets
// systemd passed are its already. Called at every READY=1; a no-op without
// a store.
func (u *Upgrader) syncStore() {
	if u.sd.FDStoreMax() == 0 {
		return
	}
	// Called on the reload loop, which must not wait: during an upgrade
	// (which holds mu while the new process starts) the next READY syncs.
	if !u.mu.TryLock() {
		return
	}
	defer u.mu.Unlock()
	if u.done {
		return
	}
	socks, err := u.sockets(false)
	if err != nil {
		u.log.Warn().Err(err).Msg("fd store: cannot export the listening sockets")
		return
	}
	want := make(map[string]bool, len(socks))
	for _, s := range socks {
		want[s.Name] = true
		if !u.stored[s.Name] {
			if _, err := u.sd.Store(s.Name, s.File); err != nil {
				u.log.Warn().Err(err).Str("name", s.Name).Msg("fd store: cannot store the socket")
			} else {
				u.stored[s.Name] = true
			}
		}
		s.File.Close()
	}
	for name := range u.stored {
		if !want[name] {
			if _, err := u.sd.Unstore(name); err != nil {
				u.log.Warn().Err(err).Str("name", name).Msg("fd store: cannot remove the socket")
				continue
			}
			delete(u.stored, name)
		}
	}
}
