package listener

// A service's live admission state. Its settings are the service's Policy
// (policy.go); this is what they are applied to, kept by the Server by
// service name across reloads (Publish), as its listeners are.

import (
	"container/list"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"fulcrum/backend"
)

// admission is one service's admission state: its service slots
// (max_conns) and the queue for them (queue_timeout), the queue for a slot
// of one of its backends, the hold queue (hold_timeout, holdqueue.go), the
// accept_rate bucket, the slots taken per client address
// (max_conns_per_source), and the counters status views read (Admission).
// A connection's lease (lease.go) holds its slots and gives them back, and
// a freed backend slot wakes the queue of the backend's service here.
type admission struct {
	service string

	active         atomic.Int64  // connections holding a service slot
	waiting        atomic.Int64  // connections in the queue now
	backendWaiting atomic.Int64  // of which waiting for a backend slot (enqueue)
	retries        atomic.Uint64 // dials tried after a failed one
	queued         atomic.Uint64 // connections that had to wait
	splits         atomic.Uint64 // times more than one backend began to claim the primary role

	mu        sync.Mutex   // protects queue, admitQ, each waiter's notified and each admitter's granted
	queue     list.List    // of *place, waiting for a backend slot, in arrival order
	admitQ    list.List    // of *admitter, waiting for a service slot, in arrival order
	admitting atomic.Int64 // admitQ's length, read without the lock

	rejects rejects                      // turned away, by reason (the refused count is RejectFull's)
	limiter atomic.Pointer[rate.Limiter] // nil: no accept_rate

	srcMu sync.Mutex // protects srcs
	srcs  map[netip.Addr]int

	hold holdQueue // hold_timeout: connections waiting for an eligible backend

	unservedMu sync.Mutex        // protects unserved
	unserved   map[string]uint64 // connections ended without a backend, by the access line's end reason
}

func newAdmission(service string) *admission { return &admission{service: service} }

// unserved counts a connection that fulcrum ended without ever handing it
// to a backend, for why: the end reason its access line gives ("no
// backend", "connect failed", "full"). It runs only on that path.
func (a *admission) unservedFor(why string) {
	a.unservedMu.Lock()
	if a.unserved == nil {
		a.unserved = map[string]uint64{}
	}
	a.unserved[why]++
	a.unservedMu.Unlock()
}

// acquire takes a service slot; with max > 0 it fails when max are taken.
func (a *admission) acquire(max int) bool {
	if max <= 0 {
		a.active.Add(1)
		return true
	}
	for {
		n := a.active.Load()
		if n >= int64(max) {
			return false
		}
		if a.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release returns a service slot. While connections wait for one (admit),
// the slot passes to the longest-waiting of them instead, so that neither a
// newcomer can take it first nor every waiter is woken to race for it.
func (a *admission) release() {
	if a.admitting.Load() > 0 {
		a.mu.Lock()
		if e := a.admitQ.Front(); e != nil {
			w := e.Value.(*admitter)
			a.admitQ.Remove(e)
			a.admitting.Add(-1)
			w.granted = true
			close(w.grant)
			a.mu.Unlock()
			return // the slot is w's now: active stays
		}
		a.mu.Unlock()
	}
	a.active.Add(-1)
}

// admitter is one connection waiting in admit.
type admitter struct {
	grant   chan struct{} // closed when a slot is handed over
	granted bool          // guarded by a.mu
}

// admit takes one of max service slots (any number if max <= 0), waiting
// until deadline for one in arrival order; it reports whether it took one.
// With gone not nil, it calls gone every interval while it waits and stops
// waiting (reporting false) once it reports true: a connection whose
// client left gives its place up.
func (a *admission) admit(max int, deadline time.Time, every time.Duration, gone func() bool) bool {
	if a.acquire(max) {
		return true
	}
	if !time.Now().Before(deadline) {
		return false
	}
	a.queued.Add(1)
	w := &admitter{grant: make(chan struct{})}
	a.mu.Lock()
	e := a.admitQ.PushBack(w)
	a.admitting.Add(1)
	a.waiting.Add(1) // once in the queue, so that a waiter counted is a waiter in line
	a.mu.Unlock()
	defer a.waiting.Add(-1)
	// A slot freed between the first try and the push went to active, not
	// to us: try once more, now that every later release hands over.
	if a.acquire(max) {
		a.mu.Lock()
		granted := w.granted
		if !granted {
			a.admitQ.Remove(e)
			a.admitting.Add(-1)
		}
		a.mu.Unlock()
		if granted { // handed one meanwhile too: give the extra back
			a.release()
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted {
		return true // handed over as the time ran out (or as it left): take it
	}
	a.admitQ.Remove(e)
	a.admitting.Add(-1)
	return false
}

// freed hands a freed slot of backend b (of this service) to the
// longest-waiting connection in the backend queue (enqueue) not already
// woken: one wake per slot, in arrival order, so a long queue costs a
// release O(1), not a wake-up of every waiter. It costs one atomic load
// when nobody waits.
func (a *admission) freed(b *backend.Backend) {
	if a.backendWaiting.Load() == 0 {
		return
	}
	a.mu.Lock()
	a.wakeAfter(nil, b)
	a.mu.Unlock()
}

// wakeAfter wakes the first waiter after e (from the front if e is nil)
// that has no wake pending, for a slot of b. a.mu must be held.
func (a *admission) wakeAfter(e *list.Element, b *backend.Backend) {
	if e == nil {
		e = a.queue.Front()
	} else {
		e = e.Next()
	}
	for ; e != nil; e = e.Next() {
		if w := e.Value.(*place); !w.notified {
			w.notified = true
			w.wake <- b // never blocks: one pending wake at most, and notified says there is none
			return
		}
	}
}

// place is one connection's place in the backend queue; only its
// connection's goroutine calls its methods.
type place struct {
	a    *admission
	e    *list.Element         // its place in a.queue; nil once it has left
	wake chan *backend.Backend // a slot of this backend was freed for it; capacity 1
	woke *backend.Backend      // the last wait returned a wake for this backend's slot, not yet known to be used
	// notified (guarded by a.mu): a wake is pending in wake, or taken by
	// wait and not yet acted on.
	notified bool
}

// enqueue joins the backend queue, at its end. The caller must try again
// once after enqueue (a slot freed just before would otherwise be missed),
// then wait, trying again after each wake, and finally leave.
func (a *admission) enqueue() *place {
	w := &place{a: a, wake: make(chan *backend.Backend, 1)}
	a.waiting.Add(1)
	a.backendWaiting.Add(1) // before it is queued: freed looks at the queue only when this is non-zero
	a.queued.Add(1)
	a.mu.Lock()
	w.e = a.queue.PushBack(w)
	a.mu.Unlock()
	return w
}

// wait blocks until a slot is handed to this connection or until deadline,
// and reports false at the deadline. Calling wait again means the slot the
// last wake handed over could not be used: if it is still free (it was of a
// backend this connection cannot use) it is handed on to the next waiter,
// so that no freed slot is lost while someone could take it; if a newcomer
// took it, nobody could, and nobody else is woken.
func (w *place) wait(deadline time.Time) bool {
	a := w.a
	if b := w.woke; b != nil {
		w.woke = nil
		a.mu.Lock()
		w.notified = false
		if b.Free() { // still free: someone behind may use it; taken (by a newcomer): nobody can
			a.wakeAfter(w.e, b)
		}
		a.mu.Unlock()
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

// leave leaves the queue. A wake handed to it and not taken by wait goes on
// to the next waiter.
func (w *place) leave() {
	if w.e == nil {
		return
	}
	a := w.a
	a.mu.Lock()
	select {
	case b := <-w.wake: // handed a slot it will not use
		a.wakeAfter(w.e, b)
	default:
	}
	a.queue.Remove(w.e)
	a.mu.Unlock()
	w.e = nil
	a.waiting.Add(-1)
	a.backendWaiting.Add(-1)
}

// setRate sets the service's accept_rate (connections per second, with a
// bucket of burst); 0 removes it. An unchanged rate keeps its bucket.
func (a *admission) setRate(perSecond float64, burst int) {
	if perSecond <= 0 {
		a.limiter.Store(nil)
		return
	}
	if burst <= 0 {
		burst = max(1, int(perSecond))
	}
	if l := a.limiter.Load(); l != nil && l.Limit() == rate.Limit(perSecond) && l.Burst() == burst {
		return
	}
	a.limiter.Store(rate.NewLimiter(rate.Limit(perSecond), burst))
}

// rate returns the accept_rate in force: connections per second and the
// bucket's size; 0, 0 when there is none.
func (a *admission) rate() (perSecond float64, burst int) {
	if l := a.limiter.Load(); l != nil {
		return float64(l.Limit()), l.Burst()
	}
	return 0, 0
}

// allowAccept takes a token from the accept_rate bucket.
func (a *admission) allowAccept() bool {
	l := a.limiter.Load()
	return l == nil || l.Allow()
}

// acquireSource takes one of max slots for client address ip; max <= 0 is
// unlimited (and takes nothing).
func (a *admission) acquireSource(ip netip.Addr, max int) bool {
	if max <= 0 {
		return true
	}
	a.srcMu.Lock()
	defer a.srcMu.Unlock()
	if a.srcs == nil {
		a.srcs = map[netip.Addr]int{}
	}
	if a.srcs[ip] >= max {
		return false
	}
	a.srcs[ip]++
	return true
}

// releaseSource returns a slot taken by acquireSource with the same max.
func (a *admission) releaseSource(ip netip.Addr, max int) {
	if max <= 0 {
		return
	}
	a.srcMu.Lock()
	defer a.srcMu.Unlock()
	if n := a.srcs[ip] - 1; n > 0 {
		a.srcs[ip] = n
	} else {
		delete(a.srcs, ip)
	}
}

// AdmissionStats are one service's admission counters, as status views
// and metrics show them.
type AdmissionStats struct {
	Active  int64  // connections holding a service slot
	Waiting int64  // connections in a queue now (a service or a backend slot)
	Retries uint64 // dials tried after a failed one
	Queued  uint64 // connections that had to wait in a queue
	Refused uint64 // connections closed for want of a slot (RejectFull)
	Splits  uint64 // split brains begun
	Holding int64  // connections held for an eligible backend now (hold_timeout)
	Held    uint64 // connections that were held
	// HoldExpired counts the held connections whose hold_timeout ran out.
	HoldExpired uint64
	// Unserved counts the connections fulcrum ended without a backend, by
	// their access line's end reason; nil when none.
	Unserved map[string]uint64
	// Rejected counts the connections turned away before any dial, by
	// reason (Reject's name): every such reason, zero or not.
	Rejected map[string]uint64
	// Rate and Burst are the accept_rate in force and its bucket's size;
	// 0, 0 when there is none.
	Rate  float64
	Burst int
}

// stats reads the counters.
func (a *admission) stats() AdmissionStats {
	st := AdmissionStats{Active: a.active.Load(), Waiting: a.waiting.Load(), Retries: a.retries.Load(),
		Queued: a.queued.Load(), Refused: a.rejects.n[RejectFull].Load(), Splits: a.splits.Load(),
		Holding: a.hold.holding.Load(), Held: a.hold.held.Load(), HoldExpired: a.hold.expired.Load(),
		Rejected: a.rejects.counts(serviceRejects, true)}
	st.Rate, st.Burst = a.rate()
	a.unservedMu.Lock()
	if len(a.unserved) > 0 {
		st.Unserved = maps.Clone(a.unserved)
	}
	a.unservedMu.Unlock()
	return st
}

// admissions are a Server's admission states by service name: a map
// replaced whole when a service first appears (Publish), so that the
// connection path reads it with one atomic load and no lock. An entry
// stays when its service leaves the configuration, as its backends' state
// stays in the pool: one added back has its counters and its bucket.
type admissions struct {
	mu sync.Mutex // serialises adding
	m  atomic.Pointer[map[string]*admission]
}

// of returns service's admission state, nil if it has none.
func (as *admissions) of(service string) *admission {
	if m := as.m.Load(); m != nil {
		return (*m)[service]
	}
	return nil
}

// get returns service's admission state, adding it if it has none.
func (as *admissions) get(service string) *admission {
	if a := as.of(service); a != nil {
		return a
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	old := as.m.Load()
	if old != nil {
		if a := (*old)[service]; a != nil {
			return a
		}
	}
	m := make(map[string]*admission, 1)
	if old != nil {
		m = maps.Clone(*old)
	}
	a := newAdmission(service)
	m[service] = a
	as.m.Store(&m)
	return a
}

// Admission reads the admission counters of service; false if the Server
// has served no snapshot naming it.
func (s *Server) Admission(service string) (AdmissionStats, bool) {
	a := s.adm.of(service)
	if a == nil {
		return AdmissionStats{}, false
	}
	return a.stats(), true
}

// Kick wakes the connections of service held for an eligible backend
// (hold_timeout) to look at the current snapshot again: a passing check
// of one of its backends calls it, since a node back within fall ×
// interval never changes state and no new snapshot would wake them.
// Publish wakes them itself. It costs one atomic load when nobody waits.
func (s *Server) Kick(service string) {
	if a := s.adm.of(service); a != nil {
		a.kick()
	}
}

// SplitBrainBegan counts the start of a split brain in service: more than
// one backend claiming the primary role.
func (s *Server) SplitBrainBegan(service string) { s.adm.get(service).splits.Add(1) }

// releaseBackend returns a slot of b taken by Acquire and hands it to the
// longest-waiting connection of b's service queued for one.
func (s *Server) releaseBackend(b *backend.Backend) {
	b.Release()
	if a := s.adm.of(b.Service); a != nil {
		a.freed(b)
	}
}
