package backend

import (
	"container/list"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Group is the live state the backends of one service share, kept across
// reloads like the backends themselves: the service's connection count (for
// its max_conns), its wait queue, and service-level counters.
//
// Typical use, per connection:
//
//	if !g.Acquire(maxConns) { ... queue with g.Wait, or refuse }
//	defer g.Release()
type Group struct {
	Service string

	active         atomic.Int64  // connections holding a service slot
	waiting        atomic.Int64  // connections in the queue now
	backendWaiting atomic.Int64  // of which waiting for a backend slot (Enqueue)
	retries        atomic.Uint64 // dials tried after a failed one
	queued         atomic.Uint64 // connections that had to wait
	refused        atomic.Uint64 // connections closed for want of a slot (at once, or when their wait ran out)
	splits         atomic.Uint64 // times more than one backend began to claim the primary role

	mu        sync.Mutex   // protects queue, admitQ, each Waiter's notified and each admitter's granted
	queue     list.List    // of *Waiter, waiting for a backend slot, in arrival order
	admitQ    list.List    // of *admitter, waiting for a service slot, in arrival order
	admitting atomic.Int64 // admitQ's length, read without the lock

	limits limits
	hold   holdQueue // hold_timeout: connections waiting for an eligible backend

	unservedMu sync.Mutex        // protects unserved
	unserved   map[string]uint64 // connections ended without a backend, by the access line's end reason
}

// Unserved counts a connection that fulcrum ended without ever handing it
// to a backend, for why: the end reason its access line gives ("no
// backend", "connect failed", "full"). It runs only on that path.
func (g *Group) Unserved(why string) {
	g.unservedMu.Lock()
	if g.unserved == nil {
		g.unserved = map[string]uint64{}
	}
	g.unserved[why]++
	g.unservedMu.Unlock()
}

// UnservedCounts returns Unserved's counts by reason; nil when none.
func (g *Group) UnservedCounts() map[string]uint64 {
	g.unservedMu.Lock()
	defer g.unservedMu.Unlock()
	if len(g.unserved) == 0 {
		return nil
	}
	return maps.Clone(g.unserved)
}

func newGroup(service string) *Group {
	g := &Group{Service: service}
	return g
}

// Acquire takes a service slot; with max > 0 it fails when max are taken.
func (g *Group) Acquire(max int) bool {
	if max <= 0 {
		g.active.Add(1)
		return true
	}
	for {
		n := g.active.Load()
		if n >= int64(max) {
			return false
		}
		if g.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release returns a service slot. While connections wait for one (Admit),
// the slot passes to the longest-waiting of them instead, so that neither a
// newcomer can take it first nor every waiter is woken to race for it.
func (g *Group) Release() {
	if g.admitting.Load() > 0 {
		g.mu.Lock()
		if e := g.admitQ.Front(); e != nil {
			w := e.Value.(*admitter)
			g.admitQ.Remove(e)
			g.admitting.Add(-1)
			w.granted = true
			close(w.grant)
			g.mu.Unlock()
			return // the slot is w's now: active stays
		}
		g.mu.Unlock()
	}
	g.active.Add(-1)
}

// admitter is one connection waiting in Admit.
type admitter struct {
	grant   chan struct{} // closed when a slot is handed over
	granted bool          // guarded by g.mu
}

// Admit takes one of max service slots (any number if max <= 0), waiting
// until deadline for one in arrival order; it reports whether it took one.
func (g *Group) Admit(max int, deadline time.Time) bool {
	return g.AdmitUnless(max, deadline, 0, nil)
}

// AdmitUnless is Admit that, while it waits, calls gone every interval
// and stops waiting (reporting false) once it reports true: a connection
// whose client left gives its place up. gone nil: Admit.
func (g *Group) AdmitUnless(max int, deadline time.Time, every time.Duration, gone func() bool) bool {
	if g.Acquire(max) {
		return true
	}
	if !time.Now().Before(deadline) {
		return false
	}
	g.waiting.Add(1)
	g.queued.Add(1)
	defer g.waiting.Add(-1)
	w := &admitter{grant: make(chan struct{})}
	g.mu.Lock()
	e := g.admitQ.PushBack(w)
	g.admitting.Add(1)
	g.mu.Unlock()
	// A slot freed between the first try and the push went to active, not
	// to us: try once more, now that every later release hands over.
	if g.Acquire(max) {
		g.mu.Lock()
		granted := w.granted
		if !granted {
			g.admitQ.Remove(e)
			g.admitting.Add(-1)
		}
		g.mu.Unlock()
		if granted { // handed one meanwhile too: give the extra back
			g.Release()
		}
		return true
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var tick <-chan time.Time
	if gone != nil {
		tk := time.NewTicker(every)
		defer tk.Stop()
		tick = tk.C
	}
wait:
	for {
		select {
		case <-w.grant:
			return true
		case <-t.C:
			break wait
		case <-tick:
			if gone() {
				break wait
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.granted {
		return true // handed over as the time ran out (or as it left): take it
	}
	g.admitQ.Remove(e)
	g.admitting.Add(-1)
	return false
}

// freed hands a freed backend slot to the longest-waiting connection (in
// the backend queue: Enqueue) not already woken: one wake per slot, in
// arrival order, so a long queue costs a release O(1), not a wake-up of
// every waiter. It costs one atomic load when nobody waits.
func (g *Group) freed(b *Backend) {
	if g.backendWaiting.Load() == 0 {
		return
	}
	g.mu.Lock()
	g.wakeAfter(nil, b)
	g.mu.Unlock()
}

// wakeAfter wakes the first waiter after e (from the front if e is nil)
// that has no wake pending, for a slot of b. g.mu must be held.
func (g *Group) wakeAfter(e *list.Element, b *Backend) {
	if e == nil {
		e = g.queue.Front()
	} else {
		e = e.Next()
	}
	for ; e != nil; e = e.Next() {
		if w := e.Value.(*Waiter); !w.notified {
			w.notified = true
			w.wake <- b // never blocks: one pending wake at most, and notified says there is none
			return
		}
	}
}

// Waiter is one connection's place in the queue; only its connection's
// goroutine calls its methods.
type Waiter struct {
	g    *Group
	e    *list.Element // its place in g.queue; nil once it has left
	wake chan *Backend // a slot of this backend was freed for it; capacity 1
	woke *Backend      // the last Wait returned a wake for this backend's slot, not yet known to be used
	// notified (guarded by g.mu): a wake is pending in wake, or taken by
	// Wait and not yet acted on.
	notified bool
}

// Enqueue joins the queue, at its end. The caller must try again once after
// Enqueue (a slot freed just before would otherwise be missed), then Wait,
// trying again after each wake, and finally Leave.
func (g *Group) Enqueue() *Waiter {
	w := &Waiter{g: g, wake: make(chan *Backend, 1)}
	g.waiting.Add(1)
	g.backendWaiting.Add(1) // before it is queued: freed looks at the queue only when this is non-zero
	g.queued.Add(1)
	g.mu.Lock()
	w.e = g.queue.PushBack(w)
	g.mu.Unlock()
	return w
}

// Wait blocks until a slot is handed to this connection or until deadline,
// and reports false at the deadline. Calling Wait again means the slot the
// last wake handed over could not be used: if it is still free (it was of a
// backend this connection cannot use) it is handed on to the next waiter,
// so that no freed slot is lost while someone could take it; if a newcomer
// took it, nobody could, and nobody else is woken.
func (w *Waiter) Wait(deadline time.Time) bool {
	g := w.g
	if b := w.woke; b != nil {
		w.woke = nil
		g.mu.Lock()
		w.notified = false
		if b.free() { // still free: someone behind may use it; taken (by a newcomer): nobody can
			g.wakeAfter(w.e, b)
		}
		g.mu.Unlock()
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case w.woke = <-w.wake:
		return true
	case <-t.C:
		return false
	}
}

// Leave leaves the queue. A wake handed to it and not taken by Wait goes on
// to the next waiter.
func (w *Waiter) Leave() {
	if w.e == nil {
		return
	}
	g := w.g
	g.mu.Lock()
	select {
	case b := <-w.wake: // handed a slot it will not use
		g.wakeAfter(w.e, b)
	default:
	}
	g.queue.Remove(w.e)
	g.mu.Unlock()
	w.e = nil
	g.waiting.Add(-1)
	g.backendWaiting.Add(-1)
}

// Retried counts a dial tried after a failed one.
func (g *Group) Retried() { g.retries.Add(1) }

// Refused counts a connection closed for want of a slot.
func (g *Group) Refused() { g.refused.Add(1) }

// SplitBrainBegan counts the start of a split brain: more than one backend
// claiming the primary role.
func (g *Group) SplitBrainBegan() { g.splits.Add(1) }

// GroupStats is a copy of a group's counters.
type GroupStats struct {
	Active  int64
	Waiting int64
	Retries uint64
	Queued  uint64
	Refused uint64
	Splits  uint64 // split brains begun
}

// Stats reads the counters.
func (g *Group) Stats() GroupStats {
	return GroupStats{Active: g.active.Load(), Waiting: g.waiting.Load(), Retries: g.retries.Load(),
		Queued: g.queued.Load(), Refused: g.refused.Load(), Splits: g.splits.Load()}
}

// Reject is why a connection was turned away before any backend was
// dialled.
type Reject uint8

// The reasons, named in logs and metrics by String.
const (
	RejectDenied     Reject = iota // allow/deny lists
	RejectRate                     // accept_rate
	RejectPerSource                // max_conns_per_source
	RejectProxy                    // a missing, malformed or untrusted PROXY header
	RejectSplitBrain               // more than one backend claims the primary role, and split_brain = "refuse"
	rejectKinds
)

var rejectNames = [rejectKinds]string{"denied", "rate", "per_source", "proxy", "split_brain"}

// String is the reason's name in logs and in metrics' reason label.
func (r Reject) String() string {
	if r < rejectKinds {
		return rejectNames[r]
	}
	return "unknown"
}

// limits are the per-service admission controls that survive reloads.
type limits struct {
	rejected [rejectKinds]atomic.Uint64
	limiter  atomic.Pointer[rate.Limiter] // nil: no accept_rate
	logEvery Every                        // rejection log lines, at most one a second

	srcMu sync.Mutex // protects sources
	srcs  map[netip.Addr]int
}

// SetRate sets the service's accept_rate (connections per second, with a
// bucket of burst); 0 removes it. An unchanged rate keeps its bucket.
func (g *Group) SetRate(perSecond float64, burst int) {
	if perSecond <= 0 {
		g.limits.limiter.Store(nil)
		return
	}
	if burst <= 0 {
		burst = max(1, int(perSecond))
	}
	if l := g.limits.limiter.Load(); l != nil && l.Limit() == rate.Limit(perSecond) && l.Burst() == burst {
		return
	}
	g.limits.limiter.Store(rate.NewLimiter(rate.Limit(perSecond), burst))
}

// Rate returns the accept_rate in force: connections per second and the
// bucket's size; 0, 0 when there is none.
func (g *Group) Rate() (perSecond float64, burst int) {
	if l := g.limits.limiter.Load(); l != nil {
		return float64(l.Limit()), l.Burst()
	}
	return 0, 0
}

// AllowAccept takes a token from the accept_rate bucket.
func (g *Group) AllowAccept() bool {
	l := g.limits.limiter.Load()
	return l == nil || l.Allow()
}

// AcquireSource takes one of max slots for client address a; max <= 0 is
// unlimited (and takes nothing).
func (g *Group) AcquireSource(a netip.Addr, max int) bool {
	if max <= 0 {
		return true
	}
	g.limits.srcMu.Lock()
	defer g.limits.srcMu.Unlock()
	if g.limits.srcs == nil {
		g.limits.srcs = map[netip.Addr]int{}
	}
	if g.limits.srcs[a] >= max {
		return false
	}
	g.limits.srcs[a]++
	return true
}

// ReleaseSource returns a slot taken by AcquireSource with the same max.
func (g *Group) ReleaseSource(a netip.Addr, max int) {
	if max <= 0 {
		return
	}
	g.limits.srcMu.Lock()
	defer g.limits.srcMu.Unlock()
	if n := g.limits.srcs[a] - 1; n > 0 {
		g.limits.srcs[a] = n
	} else {
		delete(g.limits.srcs, a)
	}
}

// Reject counts a connection turned away for why, and runs log at most
// once a second per service (so a flood does not flood the log), with the
// count for why and the number of rejections not logged since the last
// line (Every).
func (g *Group) Reject(why Reject, log func(total, suppressed uint64)) {
	n := g.limits.rejected[why].Add(1)
	if held, ok := g.limits.logEvery.Allow(); ok {
		log(n, held)
	}
}

// Rejected returns the counts of connections turned away, by reason: every
// reason, zero or not.
func (g *Group) Rejected() map[Reject]uint64 {
	out := make(map[Reject]uint64, rejectKinds)
	for i := range g.limits.rejected {
		out[Reject(i)] = g.limits.rejected[i].Load()
	}
	return out
}
