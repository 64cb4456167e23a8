package admin

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// limitStall is how long the connection limit may stay reached with not one
// new connection accepted before /healthz fails: the instance cannot serve
// a new client, and keepalived or a BGP checker should send them elsewhere.
// A var for tests.
var limitStall = 5 * time.Second

// healthRule is what /healthz answers (and fulcrum_instance_healthy shows):
// the instance's rule (cluster.Instance.Healthy), failed also while the
// daemon itself cannot take a connection, with the log writer's trouble
// and any split brain said in the text.
type healthRule struct {
	src Source

	mu      sync.Mutex // protects accepts and since
	accepts uint64     // every listener's accepts, when last looked at
	since   time.Time  // when the limit was found reached with accepts at that count; zero: it was not
}

// check answers /healthz at now.
func (h *healthRule) check(now time.Time) (ok bool, why string) {
	ok, why = true, "ok"
	if h.src.Instance != nil {
		ok, why = h.src.Instance.Healthy()
	}
	if d, stuck := h.stuck(now); stuck {
		if ok {
			ok, why = false, ""
		} else {
			why += "; "
		}
		l := h.src.Limit()
		why += fmt.Sprintf("connection limit reached (%d of %d) and no connection accepted for %s: this instance cannot serve new clients", l.Open, l.Max, d.Round(time.Second))
	}
	// A split brain is reported but does not fail the check by itself
	// (every instance sees the same backends, so moving traffic to another
	// instance would not help); the claimants it keeps from new
	// connections are not up, as everywhere, and the instance's rule
	// counts them so.
	if h.src.Snapshot != nil {
		if t := h.src.Snapshot(); t != nil {
			for _, s := range t.Services {
				if len(s.SplitBrain) > 0 {
					why += "; split brain in service " + s.Name + ": " + strings.Join(s.SplitBrain, ", ") + " claim primary"
				}
			}
		}
	}
	// Nor does a stalled log: connections are served while lines drop.
	if h.src.Log != nil {
		if n, stalled := h.src.Log(); stalled {
			why += fmt.Sprintf("; log output stalled: %d lines dropped", n)
		}
	}
	return ok, why
}

// stuck reports whether every slot of the connection limit has been held,
// with no new connection accepted on any listener, for limitStall or more
// (between two looks: each /healthz and each scrape is one).
func (h *healthRule) stuck(now time.Time) (time.Duration, bool) {
	if h.src.Limit == nil || h.src.Sockets == nil {
		return 0, false
	}
	l := h.src.Limit()
	var accepts uint64
	for _, so := range h.src.Sockets() {
		accepts += so.Accepts
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case l.Max == 0 || l.Open < l.Max:
		h.since = time.Time{}
	case h.since.IsZero() || accepts != h.accepts:
		h.since = now
	}
	h.accepts = accepts
	if h.since.IsZero() {
		return 0, false
	}
	d := now.Sub(h.since)
	return d, d >= limitStall
}
