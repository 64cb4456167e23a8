package listener

import (
	"sync/atomic"

	"fulcrum/internal/wire"
)

// Reject is why fulcrum turned a connection away before any backend took
// it: the one vocabulary of the service's counters, the listener's routing
// counters, their log lines and the metrics' reason label.
type Reject uint8

// The reasons, named by String. A service counts those up to RejectFull,
// an address routed by name those from RejectNoRoute on.
const (
	RejectDenied     Reject = iota // allow/deny lists
	RejectRate                     // accept_rate
	RejectPerSource                // max_conns_per_source
	RejectProxy                    // a missing, malformed or untrusted PROXY header
	RejectSplitBrain               // more than one backend claims the primary role, and split_brain = "refuse"
	RejectFull                     // max_conns: no slot, at once or after queue_timeout (the service's "refused"; its access line says "full")
	RejectNoRoute                  // routing by name: no route takes the client and the address has no default
	RejectMalformed                // routing by name: not a well-formed ClientHello
	RejectTooLarge                 // routing by name: the ClientHello exceeds wire.MaxHello
	RejectTimeout                  // routing by name: the client stopped inside its first message
	RejectClosed                   // routing by name: the client closed or reset inside its first message
	rejectKinds
)

var rejectNames = [rejectKinds]string{"denied", "rate", "per_source", "proxy", "split_brain", "full",
	ReasonNoRoute, wire.ReasonMalformed, wire.ReasonTooLarge, wire.ReasonTimeout, wire.ReasonClosed}

// String is the reason's name in logs and in metrics' reason label.
func (r Reject) String() string {
	if r < rejectKinds {
		return rejectNames[r]
	}
	return "unknown"
}

// The reasons a service counts as rejected (the refused, RejectFull, are
// counted apart), and those routing by name counts, as [from, to) ranges.
var (
	serviceRejects = [2]Reject{RejectDenied, RejectFull}
	routeRejects   = [2]Reject{RejectNoRoute, rejectKinds}
)

// rejectOf is the Reject of a routing refusal whose wire.Error gives
// reason (the parser's name for it).
func rejectOf(reason string) Reject {
	for r := RejectNoRoute; r < RejectClosed; r++ {
		if rejectNames[r] == reason {
			return r
		}
	}
	return RejectClosed
}

// rejects counts the connections turned away by one service or one
// listener, by reason, and lets a log line about them through at most
// once a second, so that a flood does not flood the log.
type rejects struct {
	n   [rejectKinds]atomic.Uint64
	log every // the log lines let through
}

// add counts one connection turned away for why. It reports the count for
// why, whether to log it, and how many were not logged since the last line.
func (r *rejects) add(why Reject) (total, suppressed uint64, log bool) {
	total = r.n[why].Add(1)
	suppressed, log = r.log.Allow()
	return total, suppressed, log
}

// counts returns the counts of the reasons in span by name: every one with
// all, else only those above zero (nil when none is).
func (r *rejects) counts(span [2]Reject, all bool) map[string]uint64 {
	var out map[string]uint64
	for why := span[0]; why < span[1]; why++ {
		if n := r.n[why].Load(); n > 0 || all {
			if out == nil {
				out = map[string]uint64{}
			}
			out[why.String()] = n
		}
	}
	return out
}
