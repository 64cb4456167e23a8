package health

import (
	"fmt"
	"time"

	"fulcrum/backend"
)

// Replication lag, as the checks of replicas measure it: pgsql from WAL
// positions (wal.go), mysql from SHOW SLAVE STATUS and the primary's
// binary log position, redis from INFO replication and the primary's
// offset. Each kind measures it so that a stream that went silent cannot
// read as caught up (see the check_*.go files), and hands it to
// lagVerdict, which keeps it on the answer (for backend.Backend.Lag) and
// judges it against max_lag.

// lagVerdict keeps the lag a check of a replica measured on its answer
// a, or unknown when err says why it could not, and judges it when the
// probe wants a replica within max_lag: err when the lag is unknown, an
// error when it is over, else nil. Without max_lag the lag is only kept,
// for status and metrics, and an unknown one fails nothing.
func (p *Probe) lagVerdict(a Answer, lag time.Duration, err error) (Answer, error) {
	if err != nil {
		a = a.noLag()
	} else {
		a.Lag, a.LagSet = lag, true
	}
	if p.MaxLag <= 0 || p.Role != backend.RoleReplica {
		return a, nil
	}
	if err != nil {
		return a, err
	}
	if lag > p.MaxLag {
		return a, fmt.Errorf("replication lag %s is over max_lag %s", lag.Round(time.Millisecond), p.MaxLag)
	}
	return a, nil
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
	return p.WAL.lag(time.Now(), pos, p.lagFresh(), false)
}
