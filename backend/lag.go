package backend

import (
	"fmt"
	"time"
)

// Replication lag, as the checks of replicas measure it: pgsql from WAL
// positions (wal.go), mysql from SHOW SLAVE STATUS and the primary's
// binary log position, redis from INFO replication and the primary's
// offset. Each kind measures it so that a stream that went silent cannot
// read as caught up (see the check_*.go files), and keeps it with noteLag
// for Backend.Lag.

// overLag is the verdict on a measured lag: nil within max (or no max).
func overLag(lag, limit time.Duration) error {
	if limit > 0 && lag > limit {
		return fmt.Errorf("replication lag %s is over max_lag %s", lag.Round(time.Millisecond), limit)
	}
	return nil
}

// lagFresh is how recent the primary's last recorded position must be to
// measure a replica against: max_lag, or without one (the lag is only
// kept for status and metrics) lagFresh.
func (p *Probe) lagFresh() time.Duration {
	if p.MaxLag > 0 {
		return p.MaxLag
	}
	return lagFresh
}

// clockLag is a mysql or redis replica's lag by the service's clock (the
// positions its primary's checks recorded), known only when the clock has
// a fresh mark at or before pos. A replica behind everything the clock
// knows is left to its own view: its positions are most likely of another
// primary (a failover to a node whose binary log numbers lower, or whose
// offset was behind), which must not read as minutes of lag; a stream
// silent that long has stopped its IO thread or its link anyway.
func (p *Probe) clockLag(pos uint64) (time.Duration, bool) {
	c := p.WAL
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	behind := len(c.marks) > 0 && pos < c.marks[0].pos
	c.mu.Unlock()
	if behind {
		return 0, false
	}
	return c.Lag(time.Now(), pos, p.lagFresh())
}
