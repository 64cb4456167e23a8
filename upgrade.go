package main

// The binary upgrade: the running daemon starts the binary now installed
// at its own path, hands it every listening socket (and the admin one),
// waits until it serves, makes it systemd's main process (MAINPID=) and
// then drains and exits. Both processes accept from the same sockets
// during the overlap, so no connection is refused or reset. A new binary
// that fails to start, exits or is not ready within upgradeTimeout is
// stopped, and this one serves on as if nothing had happened.

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

// upgradeTimeout bounds how long the new process may take to load its
// configuration, resolve its backends and bind: above reload's resolve
// timeout, below systemd's WatchdogSec= in the unit.
const upgradeTimeout = 20 * time.Second

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

// upgrader performs upgrades for the admin listener's POST /upgrade.
type upgrader struct {
	srv      *listener.Server
	sd       *systemd.Notifier
	log      zerolog.Logger
	names    map[netip.AddrPort]string // systemd's names for the sockets it passed
	admin    *net.TCPListener          // nil without [admin] listen
	adminKey netip.AddrPort            // admin's address as configured
	timeout  time.Duration
	// handOver, if set, is called when the new process serves, before
	// MAINPID=: this one stops writing what the new one now owns (the
	// state file).
	handOver func()

	mu     sync.Mutex      // serialises upgrades and store syncs; protects done and stored
	done   bool            // handed over: this process is draining
	stored map[string]bool // names in systemd's fd store, when it keeps one (syncStore)
	// handoff receives the new process's pid once, when it serves: run
	// then stops the admin listener and drains. Buffered 1.
	handoff chan int
	// handedOff is set with done, for Notify, which must not take mu.
	handedOff atomic.Bool
	// ready, set before Run when an upgrade started this process, tells
	// the old process that this one serves (systemd.Notifier.UpgradeReady).
	ready     func() error
	readyOnce sync.Once
}

func newUpgrader(srv *listener.Server, sd *systemd.Notifier, log zerolog.Logger) *upgrader {
	return &upgrader{srv: srv, sd: sd, log: log, names: map[netip.AddrPort]string{}, timeout: upgradeTimeout,
		stored: map[string]bool{}, handoff: make(chan int, 1)}
}

// adopt takes from socks those a previous fulcrum passed (an upgrading
// one, or systemd's fd store): the listeners go to the Server, the admin
// listener is returned if it is still bound to admin (else closed). It
// returns the sockets left, systemd's own.
func (u *upgrader) adopt(socks []systemd.Socket, admin netip.AddrPort) (rest []systemd.Socket, adminLn *net.TCPListener) {
	for _, so := range socks {
		if a, ok := decodeKey(listenPrefix, so.Name); ok {
			u.stored[so.Name] = true // if it came from the fd store, it is there; syncStore removes it if need be
			u.srv.Adopt(a, so.Listener)
			u.log.Info().Stringer("listen", a).Msg("socket adopted from the previous process")
			continue
		}
		if a, ok := decodeKey(adminPrefix, so.Name); ok {
			u.stored[so.Name] = true
			if a == admin && adminLn == nil {
				adminLn = so.Listener
			} else {
				so.Listener.Close() // [admin] listen changed in between
			}
			continue
		}
		rest = append(rest, so)
	}
	return rest, adminLn
}

// Notify is reload's notify: it sends state to systemd, but
//   - in a process an upgrade started, the first READY=1 goes to the old
//     process instead, which then sends MAINPID= (systemd takes no message
//     from this one before); every later one (after a reload's
//     RELOADING=1) goes to systemd, as in any process, or systemd would
//     hold the unit in "reloading" until its timeout;
//   - in a process that has handed over, nothing is sent: the new one is
//     systemd's main process now;
//   - with an fd store, each READY=1 first brings it up to date.
func (u *upgrader) Notify(state string) error {
	if u.handedOff.Load() {
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

// errUpgraded refuses a second upgrade in a process that has handed over.
var errUpgraded = errors.New("this process has already handed over to a new one and is draining")

// Upgrade replaces this process and returns the new one's pid, or the
// reason it did not, in which case this process serves on.
func (u *upgrader) Upgrade() (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return 0, errUpgraded
	}
	pid, err := u.start()
	if err != nil {
		u.log.Error().Err(err).Msg("upgrade failed; this process serves on")
		return 0, err
	}
	u.done = true
	u.handedOff.Store(true)
	if u.handOver != nil {
		u.handOver()
	}
	// This process's last message, and the one only it may send: under
	// NotifyAccess=main systemd takes MAINPID= from the main process alone.
	if _, err := u.sd.Notify(systemd.MainPID(pid) + "\n" + systemd.Status(fmt.Sprintf("upgraded: pid %d serves, pid %d drains", pid, os.Getpid()))); err != nil {
		u.log.Warn().Err(err).Msg("sd_notify failed")
	}
	u.log.Info().Int("pid", pid).Msg("upgrade: the new process serves; draining")
	u.handoff <- pid
	return pid, nil
}

// start exports the sockets, starts the new binary and waits for it.
func (u *upgrader) start() (int, error) {
	exe, err := os.Executable() // re-resolved: the binary now installed at our path
	if err != nil {
		return 0, fmt.Errorf("upgrade: find the binary: %w", err)
	}
	socks, err := u.sockets(true)
	if err != nil {
		return 0, fmt.Errorf("upgrade: %w", err)
	}
	defer func() {
		for _, s := range socks {
			s.File.Close()
		}
	}()
	u.log.Info().Str("binary", exe).Int("sockets", len(socks)).Msg("upgrade: starting the new process")
	p, err := systemd.Upgrade(exe, os.Args[1:], os.Environ(), socks, os.Stdout, os.Stderr, u.timeout)
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
// closes the Files.
func (u *upgrader) sockets(withSystemd bool) ([]systemd.Passed, error) {
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
func (u *upgrader) syncStore() {
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
