package backend

import "sync"

// Pool maps (service, backend name) to the one live *Backend, so that state
// survives reloads. Only the reload path uses it; the connection path holds
// *Backend values taken from a snapshot.
type Pool struct {
	// Changes, if set before the first Get, receives each backend whose
	// health changed (up to down or back). Sends never block: when the
	// channel is full a report is dropped, and the reader should rescan.
	Changes chan<- *Backend
	// Events records every backend's state changes (and the services'
	// own, which their owner adds); it outlives reloads with the pool.
	Events Events

	mu sync.Mutex // protects m
	m  map[key]*Backend
}

type key struct{ service, name string }

// Get returns the backend for (service, name), creating it if needed. A
// backend still draining after its removal is returned as it is, counters and
// open connections included; the caller undrains it once a snapshot that
// names it is live. Get adds to the pool at once: a reload builds through a
// Draft instead, so that a reload that fails adds nothing.
func (p *Pool) Get(service, name string) *Backend {
	d := p.Draft()
	b := d.Get(service, name)
	d.Commit()
	return b
}

// Draft is a pending change of a Pool: the backends a new
// configuration names, the existing ones as they are and new ones created
// but not yet in the pool. Commit adds them; a draft that is dropped
// leaves the pool as it was. Drafts are not safe for concurrent use, and
// two drafts of one pool must not be committed out of order (reload
// serialises them).
type Draft struct {
	p  *Pool
	bs map[key]*Backend
}

// Draft starts a pending change of p.
func (p *Pool) Draft() *Draft {
	return &Draft{p: p, bs: map[key]*Backend{}}
}

// Get returns the backend for (service, name): the pool's, or a new one
// that Commit will add.
func (d *Draft) Get(service, name string) *Backend {
	k := key{service, name}
	if b, ok := d.bs[k]; ok {
		return b
	}
	d.p.mu.Lock()
	b, ok := d.p.m[k]
	d.p.mu.Unlock()
	if !ok {
		b = New(service, name)
		b.changes = d.p.Changes
		b.events = &d.p.Events
	}
	d.bs[k] = b
	return b
}

// Commit puts every backend the draft handed out into the pool.
// One that a finished drain forgot meanwhile is put back: the new snapshot
// names it, so it is live again.
func (d *Draft) Commit() {
	p := d.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[key]*Backend{}
	}
	for k, b := range d.bs {
		p.m[k] = b
	}
}

// Forget removes b once its drain has finished, unless it was re-added
// (and so is no longer draining) meanwhile.
func (p *Pool) Forget(b *Backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key{b.Service, b.Name}
	if p.m[k] == b && b.draining.Load() {
		delete(p.m, k)
	}
}

// Len is the number of backends in the pool, draining ones included.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
