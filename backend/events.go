package backend

import (
	"sync"
	"time"
)

// Events is a bounded ring of the last state changes of a pool's backends
// and services: what happened, to what, when and why, kept in memory so
// that `fulcrum status -events` and the web console can show the recent
// past without the journal. It belongs to the Pool, so it survives
// reloads; it is safe for concurrent use. The zero value keeps
// DefaultEvents events.
type Events struct {
	mu   sync.Mutex // protects ring, next and seq
	ring []Event    // len ≤ cap; when full, next is the oldest
	next int
	seq  uint64
	Max  int // capacity; 0: DefaultEvents. Set before the first Add
}

// DefaultEvents is how many events a ring keeps by default: a bad night of
// flapping backends, and a small /status.
const DefaultEvents = 256

// Event is one state change. Backend is "" for a service's own events
// (fallback, holding, no eligible backend).
type Event struct {
	Seq     uint64    `json:"seq"` // 1 for the first event of the process, +1 each
	At      time.Time `json:"at"`
	Service string    `json:"service"`
	Backend string    `json:"backend,omitempty"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Reason  string    `json:"reason,omitempty"`
}

// Add records e, numbering it; on a full ring the oldest event goes.
func (r *Events) Add(e Event) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	max := r.Max
	if max <= 0 {
		max = DefaultEvents
	}
	r.seq++
	e.Seq = r.seq
	if len(r.ring) < max {
		r.ring = append(r.ring, e)
		return
	}
	r.ring[r.next] = e
	r.next = (r.next + 1) % len(r.ring)
}

// List returns the events kept, oldest first.
func (r *Events) List() []Event {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Event, 0, len(r.ring))
	out = append(out, r.ring[r.next:]...)
	return append(out, r.ring[:r.next]...)
}
