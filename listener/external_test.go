package listener_test

// Helpers of package listener_test, whose tests configure a feature as a
// user does, in a configuration's text, and run it through testkit/proxy:
// a whole proxy (conf, reload.Manager, listener.Server) talking over
// loopback.

import (
	"net"
	"time"

	"fulcrum/internal/testkit"
)

// dialFrom connects to addr from a chosen loopback source address.
func dialFrom(src, addr string) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// busy scales a tight timing bound on this shared 2-core machine under the
// race detector; 1 where nothing slows the process down.
func busy() time.Duration {
	if testkit.RaceEnabled {
		return 5
	}
	return 1
}
