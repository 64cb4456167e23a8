package backend

import "sync"

// Pool maps (service, backend name) to the one live *Backend, so that state
// survives reloads. Only the reload path uses it; the connection path holds
// *Backend values taken from a snapshot.
type Pool struct {
	mu sync.Mutex // protects m
	m  map[key]*Backend
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
		p.m[k] = b
	}
	return b
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

// Len is the number of backends in the pool, draining ones included.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
