package listener

import (
	"fmt"
	"math/rand/v2"
	"time"

	"golang.org/x/sys/unix"
)

// TCP keepalive, per service and per socket. Each socket's idle time is
// spread ±20% at random: connections opened in a burst (a pool at start-up
// or after a failover) would otherwise probe in step, and on a busy host the
// synchronised probes and their retries overflow the backlog until the
// kernel resets healthy connections. The setter takes a raw descriptor, so
// that any accept or dial path can call it.

// keepAlive is one service's keepalive; a zero Idle turns it off.
type keepAlive struct {
	Idle     time.Duration // before the first probe, before the spread
	Interval time.Duration // between probes
	Count    int           // unanswered probes before the connection is reset
}

// keepAliveFor returns pol's keepalive settings.
func keepAliveFor(pol *Policy) keepAlive {
	return keepAlive{Idle: pol.KeepAliveIdle, Interval: pol.KeepAliveInterval, Count: pol.KeepAliveCount}
}

// jitteredIdle returns idle spread uniformly over ±20%, in whole seconds
// (the socket option's unit), at least one.
func jitteredIdle(idle time.Duration) int {
	d := float64(idle) * (0.8 + 0.4*rand.Float64())
	return max(1, int(d/float64(time.Second)+0.5))
}

// setKeepAliveFD applies ka to the TCP socket fd: SO_KEEPALIVE and, when on,
// the idle time (spread), interval and count. Off clears SO_KEEPALIVE, which
// a socket may have from elsewhere (Go sets it on sockets accepted from a
// listener systemd passed).
func setKeepAliveFD(fd int, ka keepAlive) error {
	if ka.Idle <= 0 {
		if err := setsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0); err != nil {
			return fmt.Errorf("clear keepalive: %w", err)
		}
		return nil
	}
	for _, o := range [...]struct{ level, opt, v int }{
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, jitteredIdle(ka.Idle)},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, max(1, int(ka.Interval/time.Second))},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, max(1, ka.Count)},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	} {
		if err := setsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fmt.Errorf("set keepalive: %w", err)
		}
	}
	return nil
}
