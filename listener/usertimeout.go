package listener

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// user_timeout: TCP_USER_TIMEOUT bounds how long sent data may stay
// unacknowledged before the kernel drops the connection, so that a peer
// that vanished without a FIN or an RST (a crashed host, a pulled cable, a
// failed-over address) is found in seconds rather than after the ~15
// minutes of retransmissions Linux allows by default. Keepalive probes
// count as such data, so it also bounds an idle connection's detection
// once keepalive starts probing.

// userTimeout returns a net.Dialer Control function that sets
// TCP_USER_TIMEOUT before the connect, so that it bounds the handshake's
// retransmissions too; nil when d <= 0.
func userTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	if d <= 0 {
		return nil
	}
	ms := int(d / time.Millisecond)
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = sockfd.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
		})
		if err != nil {
			return err
		}
		return serr
	}
}
