package listener

// source = "client": a backend connection bound to the client's own
// address with IP_TRANSPARENT (Linux), so that the backend sees the client
// (PostgreSQL's pg_hba.conf by subnet, inet_client_addr()). The socket
// option needs CAP_NET_ADMIN (or CAP_NET_RAW); the backend's replies to the
// client's address must be routed back to fulcrum's host, and there to the
// socket (policy routing to a local table, and a mark on packets of
// transparent sockets): reload proves both with ProbeSource before it
// takes a file that asks for it (docs/databases.md has the recipe).
//
// The port is 0, chosen by the kernel at connect (IP_BIND_ADDRESS_NO_PORT,
// so that it is chosen for the whole 4-tuple, as for an unbound socket):
// the client's own port would collide whenever one client reaches the same
// backend through two of fulcrum's addresses (or two services), and with
// the client's next connection from that port while fulcrum's side of the
// last one is still in TIME_WAIT. The address is what pg_hba.conf and
// inet_client_addr() read; the port tells nothing a rule could use.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// ErrNoTransparent is what source = "client" meets without the privilege
// IP_TRANSPARENT needs (EPERM).
var ErrNoTransparent = errors.New(`source = "client" needs CAP_NET_ADMIN to bind a client's address (IP_TRANSPARENT)`)

// errSourceFamily: a client address cannot be the source of a connection
// to a backend of the other IP family.
var errSourceFamily = errors.New("the client's address and the backend's are of different IP families")

// bindClient makes fd, a new socket of the family of backend address to,
// transparent and binds it to client address a, port 0 (chosen at connect).
func bindClient(fd int, a netip.Addr, to netip.AddrPort) error {
	a = a.Unmap()
	if a.Is4() != to.Addr().Unmap().Is4() {
		return fmt.Errorf("bind %s: %w (backend %s)", a, errSourceFamily, to)
	}
	if err := setTransparent(fd, a.Is6()); err != nil {
		return err
	}
	if err := sockfd.SetsockoptInt(fd, unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1); err != nil {
		return err
	}
	return sockfd.Bind(fd, netip.AddrPortFrom(a, 0))
}

// setTransparent sets IP_TRANSPARENT (IPV6_TRANSPARENT on an IPv6 socket)
// on fd; EPERM is ErrNoTransparent.
func setTransparent(fd int, v6 bool) error {
	level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
	if v6 {
		level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
	}
	err := sockfd.SetsockoptInt(fd, level, opt, 1)
	if errors.Is(err, unix.EPERM) {
		return ErrNoTransparent
	}
	return err
}

// CheckTransparent reports whether this process may make transparent
// sockets of a's family: nil, ErrNoTransparent, or why it cannot tell.
func CheckTransparent(a netip.Addr) error {
	family := unix.AF_INET
	if a.Is6() && !a.Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := sockfd.Socket(family)
	if err != nil {
		return err
	}
	defer sockfd.Close(fd)
	return setTransparent(fd, family == unix.AF_INET6)
}

// ProbeSource connects to backend to from address from, not one of this
// host's, on a transparent socket, and closes the connection at once: its
// handshake completes only if the backend's reply to from comes back to
// this host and to the socket, the route every connection of a service
// with source = "client" needs. The error is the dial's: a refusal
// (ECONNREFUSED) came back too, and proves the route as well as a success.
func ProbeSource(ctx context.Context, from netip.Addr, to netip.AddrPort, timeout time.Duration) error {
	d := net.Dialer{
		Timeout:   timeout,
		LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)),
		Control: func(_, _ string, c syscall.RawConn) error {
			var err error
			if cerr := c.Control(func(fd uintptr) { err = setTransparent(int(fd), from.Is6() && !from.Is4In6()) }); cerr != nil {
				return cerr
			}
			return err
		},
	}
	c, err := d.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return err
	}
	return c.Close()
}
