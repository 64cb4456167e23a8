package torture

import (
	"math/rand/v2"
	"net/netip"
	"time"
)

// Half-close orders.
const (
	together     = iota // each side sends its FIN when it has written all
	clientFirst         // the backend sends its FIN only after the client's has come
	backendFirst        // the client sends its FIN only after the backend's has come
)

// plan is one connection's life, a pure function of (seed, id): the
// client and the backend each derive their side from it.
type plan struct {
	seed, id uint64
	svc      *service
	limit    time.Duration // no byte for this long: the stream has stalled
	prog     *progress     // the last byte moved at either end
	sni      string        // tls services: the name the ClientHello carries
	hello    []byte        // that ClientHello
	localIP  netip.Addr    // the client binds it: the access line's key
	clientIP netip.Addr    // the client as fulcrum sees it: localIP, or the PROXY header's source
	ppV1     bool          // PROXY v1 rather than v2

	up, down int64 // bytes each way (up at least 8: the id)
	order    int
	tiny     bool // writes of at most 64 bytes

	cliSlow, beSlow   bool
	cliStall, beStall stall
	longStall         bool  // timed: the client stalls past idle_timeout (fulcrum must end it)
	cliOOB, beOOB     int64 // an urgent byte after this many bytes; -1 none

	rstClientDown  int64 // the client resets after reading this many bytes; -1 never
	rstBackendUp   int64 // the backend resets after reading this many
	rstBackendDown int64 // or after writing this many
}

func (p *plan) rng(side uint64) *rand.Rand {
	return rand.New(rand.NewPCG(p.seed^p.id*0x9e3779b97f4a7c15, side))
}

// faulty reports whether the plan ends the connection early on purpose.
func (p *plan) faulty() bool {
	return p.rstClientDown >= 0 || p.rstBackendUp >= 0 || p.rstBackendDown >= 0 || p.longStall
}

// size draws a stream length: mostly small, some large, a few of tens of MiB.
func size(r *rand.Rand, huge int64) int64 {
	switch x := r.Float64(); {
	case x < 0.35:
		return 1 + r.Int64N(512)
	case x < 0.70:
		return 512 + r.Int64N(64<<10)
	case x < 0.93:
		return 64<<10 + r.Int64N(1<<20)
	case x < 0.99:
		return 1<<20 + r.Int64N(7<<20)
	default:
		return 8<<20 + r.Int64N(huge-8<<20)
	}
}

// newPlan draws the plan of connection id; a churn connection is a short
// one to the cut service, whose backends are Cut in a loop meanwhile.
func (h *harness) newPlan(id uint64, churn bool) *plan {
	p := &plan{seed: h.seed, id: id, cliOOB: -1, beOOB: -1, rstClientDown: -1, rstBackendUp: -1, rstBackendDown: -1, limit: h.stallLimit, prog: newProgress()}
	r := p.rng(1)
	if churn {
		p.svc = h.svc["cut"]
		p.localIP = netip.AddrFrom4([4]byte{127, byte(64 + id>>16), byte(id >> 8), byte(id)})
		p.clientIP = p.localIP
		p.up, p.down = 8+r.Int64N(4<<10), r.Int64N(4<<10)
		p.order = r.IntN(3)
		p.limit = 10 * time.Second // a session that moves nothing for this long is wedged
		return p
	}
	x := r.IntN(h.weightSum)
	for _, s := range h.services {
		if x < s.share {
			p.svc = s
			break
		}
		x -= s.share
	}
	if p.svc.tls {
		p.sni = "a.torture.test"
		if r.IntN(2) == 1 {
			p.sni = "b.torture.test"
			p.svc = h.svc["tlsb"]
		} else {
			p.svc = h.svc["tlsa"]
		}
		p.hello = h.hellos[p.sni]
	}
	p.localIP = netip.AddrFrom4([4]byte{127, byte(64 + id>>16), byte(id >> 8), byte(id)})
	p.clientIP = p.localIP
	if p.svc.pp {
		p.clientIP = netip.AddrFrom4([4]byte{10, byte(id >> 16), byte(id >> 8), byte(id)})
		p.ppV1 = r.IntN(2) == 0
	}
	p.up, p.down = max(8, size(r, h.huge)), size(r, h.huge)
	if r.IntN(20) == 0 {
		p.down = 0
	}
	p.order = r.IntN(3)
	p.tiny = p.up < 16<<10 && p.down < 16<<10 && r.IntN(4) == 0
	small := func(n int64) bool { return n < 1<<20 }
	p.cliSlow = small(p.down) && r.IntN(8) == 0
	p.beSlow = small(p.up) && r.IntN(8) == 0
	if r.IntN(8) == 0 {
		p.cliStall = stall{at: r.Int64N(p.down + 1), d: time.Duration(100+r.IntN(900)) * time.Millisecond}
	}
	if r.IntN(8) == 0 {
		p.beStall = stall{at: r.Int64N(p.up + 1), d: time.Duration(100+r.IntN(900)) * time.Millisecond}
	}
	if p.svc.name == "timed" && r.IntN(6) == 0 {
		p.longStall = true
		p.cliStall = stall{at: r.Int64N(p.down + 1), d: h.idleTimeout + 3*time.Second}
	}
	if h.oob && r.IntN(25) == 0 {
		p.cliOOB = r.Int64N(p.up + 1)
	}
	if h.oob && r.IntN(25) == 0 {
		p.beOOB = r.Int64N(p.down + 1)
	}
	switch f := r.IntN(20); {
	case f == 0 && p.down > 0: // the client resets, once it has bytes back (routing done)
		p.rstClientDown = 1 + r.Int64N(p.down)
	case f == 1:
		p.rstBackendUp = 8 + r.Int64N(p.up-7)
	case f == 2:
		p.rstBackendDown = r.Int64N(p.down + 1)
	}
	return p
}
