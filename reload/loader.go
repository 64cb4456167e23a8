package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"

	"fulcrum/conf"
)

// The loader is the goroutine that reads, parses and resolves for Run, so
// that Run's loop, which owns the watchdog ping, SIGTERM and health
// changes, never waits on a disk or a DNS server. It works one request at a
// time and hands each result back to the loop, which applies it.

// loadReq is one request to the loader.
type loadReq struct {
	file  bool // read the file and apply it if its content changed
	force bool // read and apply it even if unchanged (SIGHUP)
	again bool // read and apply it even if unchanged: the last read was dropped, taken mid-write
	dns   bool // resolve the running configuration's names again, applying a change
	// recheck: the periodic re-read ([reload] recheck) asked, not a file
	// event; it names the trigger only when nothing else asked too.
	recheck bool
}

// merge folds a request that was still pending into r.
func (r loadReq) merge(o loadReq) loadReq {
	return loadReq{file: r.file || o.file, force: r.force || o.force, dns: r.dns || o.dns, again: r.again || o.again,
		recheck: (r.recheck || !r.file) && (o.recheck || !o.file)}
}

// loaded is the loader's answer: a configuration to apply with its names
// resolved, an error to report, or (both nil) nothing to do.
type loaded struct {
	cfg     *conf.Config
	dns     names
	err     error
	trigger string // what led to it: "file" (an inotify event), "recheck", "sighup" or "dns"
}

type loader struct {
	m    *Manager
	reqs chan loadReq  // at most one pending request; only Run's loop sends
	out  chan loaded   // one answer per request taken
	done chan struct{} // closed when run returns

	// Touched only by the loader's goroutine.
	tried [32]byte // digest of the content last tried, applied or not
	gone  bool     // the file was missing at the last read
}

func newLoader(m *Manager, digest [32]byte) *loader {
	return &loader{m: m, tried: digest, reqs: make(chan loadReq, 1), out: make(chan loaded, 1), done: make(chan struct{})}
}

// request queues r without waiting; a request still pending is merged
// into it. Called only from Run's loop.
func (l *loader) request(r loadReq) {
	for {
		select {
		case l.reqs <- r:
			return
		default:
		}
		select {
		case old := <-l.reqs:
			r = r.merge(old)
		default: // the loader took it meanwhile: the send succeeds now
		}
	}
}

// run serves requests until ctx ends. Each answer is handed to the loop;
// when ctx ends first the answer is dropped (the daemon is stopping).
func (l *loader) run(ctx context.Context) {
	defer close(l.done)
	for {
		var req loadReq
		select {
		case <-ctx.Done():
			return
		case req = <-l.reqs:
		}
		res := l.load(ctx, req)
		select {
		case l.out <- res:
		case <-ctx.Done():
			return
		}
	}
}

// load does one request: read the file and, if it changed (or force),
// parse it and resolve its names; else, if asked, resolve the running
// configuration's names again.
func (l *loader) load(ctx context.Context, req loadReq) loaded {
	if req.file || req.force {
		if res, done := l.read(ctx, req.force, req.again, req.recheck); done || !req.dns {
			return res
		}
	}
	return l.reresolve(ctx)
}

// read reads the file; done is false when its content is what was last
// tried (and not force), so there is nothing to apply.
func (l *loader) read(ctx context.Context, force, again, recheck bool) (res loaded, done bool) {
	m := l.m
	data, err := conf.Read(m.path) // refuses a file above conf.MaxSize before reading it
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if !l.gone {
				l.gone = true
				m.log.Warn().Str("file", m.path).Msg("configuration file is gone; the running configuration stays")
			}
			return loaded{}, false
		}
		return loaded{err: err, trigger: "file"}, true
	}
	if l.gone {
		l.gone = false
		m.log.Info().Str("file", m.path).Msg("configuration file is back")
	}
	digest := sha256.Sum256(data)
	if !force && !again && digest == l.tried {
		return loaded{}, false
	}
	l.tried = digest
	if why := conf.Exposed(m.path); why != "" {
		m.log.Warn().Msg(why)
	}
	trigger := "file"
	switch {
	case force:
		trigger = "sighup"
	case recheck:
		trigger = "recheck" // inotify missed the change (or could not watch)
	}
	cfg, err := conf.Parse(m.path, data)
	if err != nil {
		return loaded{err: err, trigger: trigger}, true
	}
	for _, w := range cfg.Warnings() { // valid, and most likely not meant
		m.log.Warn().Msg(w)
	}
	return loaded{cfg: cfg, dns: lookupAll(ctx, m.lookup(), cfg.Names(), m.resolved(), m.resolveTimeout()), trigger: trigger}, true
}

// reresolve resolves the running configuration's names again and returns
// it for applying when an address changed.
func (l *loader) reresolve(ctx context.Context) loaded {
	m := l.m
	cfg := m.current()
	if cfg == nil {
		return loaded{}
	}
	prev := m.resolved()
	dns := lookupAll(ctx, m.lookup(), cfg.Names(), prev, m.resolveTimeout())
	for h, r := range dns {
		if r.err != nil && prev[h].err == nil && r.addr.IsValid() {
			m.log.Warn().Str("host", h).Err(r.err).Stringer("keeping", r.addr).Msg("host name does not resolve; keeping its last address")
		}
	}
	if !prev.changed(dns) {
		return loaded{}
	}
	return loaded{cfg: cfg, dns: dns, trigger: "dns"}
}
