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

	mu     sync.Mutex // protects m and groups
	m      map[key]*Backend
	groups map[string]*Group
}

type key struct{ service, name string }

// Get returns the backend for (service, name), creating it if needed. A
// backend still draining after its removal is returned as it is, counters and
// open connections included; the caller undrains it once a snapshot that
// names it is live, so a reload that fails changes nothing.
func (p *Pool) Get(service, name string) *Backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[key]*Backend{}
	}
	k := key{service, name}
	b, ok := p.m[k]
	if !ok {
		b = New(service, name)
		b.changes = p.Changes
		b.group = p.group(service)
		p.m[k] = b
	}
	return b
}

// Group returns the live state shared by the service's backends.
func (p *Pool) Group(service string) *Group {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.group(service)
}

func (p *Pool) group(service string) *Group {
	if p.groups == nil {
		p.groups = map[string]*Group{}
	}
	g, ok := p.groups[service]
	if !ok {
		g = newGroup(service)
		p.groups[service] = g
	}
	return g
}

// Forget removes b once its drain has finished, unless it was re-added
// (and so is no longer draining) meanwhile.
func (p *Pool) Forget(b *Backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key{b.Service, b.Name}
	if p.m[k] == b && b.Draining() {
		delete(p.m, k)
	}
}

// Each calls f for every backend in the pool, draining ones included.
func (p *Pool) Each(f func(*Backend)) {
	p.mu.Lock()
	bs := make([]*Backend, 0, len(p.m))
	for _, b := range p.m {
		bs = append(bs, b)
	}
	p.mu.Unlock()
	for _, b := range bs {
		f(b)
	}
}

// Len is the number of backends in the pool, draining ones included.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
