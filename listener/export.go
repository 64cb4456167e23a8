package listener

// Passing listening sockets to the process that replaces this one (a
// binary upgrade, package handover): Export dups every socket the Server holds, and the new
// process takes them back with Inherit (sockets systemd passed) or Adopt
// (sockets the old process bound itself). Both processes then accept from
// the same kernel queue until the old one closes its descriptors, so no
// SYN finds the address unbound.

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"fulcrum/internal/sockfd"
)

// Exported is one listening socket to pass to another process.
type Exported struct {
	Key       netip.AddrPort // the address as configured (port 0 stays 0); for a spare, as bound
	Inherited bool           // passed by systemd, not bound by this process
	// File is a duplicate of the socket's descriptor, close-on-exec and
	// still non-blocking; the caller closes it. It is not made with
	// TCPListener.File: handing that one to os.StartProcess would call Fd,
	// which clears O_NONBLOCK on the open file description that this
	// process's accept path shares, and its loops would then block a thread
	// in accept(2).
	File *os.File
}

// Export duplicates every listening socket the Server holds, in service or
// spare. On error it closes what it duplicated.
func (s *Server) Export() ([]Exported, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Exported, 0, len(s.lns)+len(s.spare))
	add := func(key netip.AddrPort, ln *lsock, inherited bool) error {
		f, err := ln.file()
		if err != nil {
			return fmt.Errorf("export listener %s: %w", key, err)
		}
		out = append(out, Exported{Key: key, Inherited: inherited, File: f})
		return nil
	}
	var err error
	for a, so := range s.lns {
		if err = add(a, so.ln, so.inherited); err != nil {
			break
		}
	}
	for a, ln := range s.spare {
		if err != nil {
			break
		}
		err = add(a, ln, !s.adopted[a])
	}
	if err != nil {
		for _, e := range out {
			e.File.Close()
		}
		return nil, err
	}
	return out, nil
}

// file duplicates l's descriptor with F_DUPFD_CLOEXEC.
func (l *lsock) file() (*os.File, error) {
	nfd, err := sockfd.Dup(l.fd)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), "listener-"+l.addr.String()), nil
}

// Dup duplicates ln's descriptor with F_DUPFD_CLOEXEC.
func Dup(ln *net.TCPListener) (*os.File, error) {
	nfd, err := dupListener(ln)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), "listener-"+ln.Addr().String()), nil
}

// dupListener duplicates ln's descriptor with F_DUPFD_CLOEXEC, as a raw
// descriptor in no poller.
func dupListener(ln *net.TCPListener) (int, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { nfd, derr = sockfd.Dup(int(fd)) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	return nfd, nil
}

// Adopt offers a listening socket that the process this one replaces had
// bound for the configured address key. Prepare uses it for key instead of
// binding, and it is then this Server's own: a reload that removes key
// closes it, as it would a socket it had bound. CloseUnadopted closes
// those that the configuration does not use. It takes ln over
// (takeListener): the caller no longer uses or closes it.
func (s *Server) Adopt(key netip.AddrPort, ln *net.TCPListener) error {
	l, err := takeListener(ln)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adopted == nil {
		s.adopted = map[netip.AddrPort]bool{}
	}
	s.spare[key] = l
	s.adopted[key] = true
	return nil
}

// CloseUnadopted closes the adopted sockets that no listener took: their
// address left the configuration during the upgrade. Sockets passed by
// systemd stay, as Inherit says.
func (s *Server) CloseUnadopted() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	var closed []netip.AddrPort
	for a := range s.adopted {
		if ln, ok := s.spare[a]; ok {
			ln.Close()
			delete(s.spare, a)
			closed = append(closed, a)
		}
		delete(s.adopted, a)
	}
	return closed
}
