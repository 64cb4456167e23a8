// Package reload is the sole writer of fulcrum's snapshot. It turns a
// validated configuration into the next sched.Table, opens the listeners
// that are new, swaps the table in atomically, closes the listeners that
// were removed, and drains the backends that were removed.
//
// Typical use (main does this):
//
//	var ptr atomic.Pointer[sched.Table]
//	srv := listener.New(&ptr, log)
//	m := reload.New(path, &ptr, srv, log)
//	err := m.Run(ctx) // applies the file, serves until ctx ends, then shuts down
//
// Ownership: the Manager owns the drain goroutines it starts and waits for
// them before Run returns; main owns the atomic pointer and the Server.
package reload

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/sched"
)

// Manager applies configurations, one at a time.
type Manager struct {
	path string
	ptr  *atomic.Pointer[sched.Table]
	srv  *listener.Server
	log  zerolog.Logger
	pool backend.Pool

	mu     sync.Mutex // serialises Apply and shutdown
	drains sync.WaitGroup
}

// New returns a Manager for the file at path.
func New(path string, ptr *atomic.Pointer[sched.Table], srv *listener.Server, log zerolog.Logger) *Manager {
	return &Manager{path: path, ptr: ptr, srv: srv, log: log.With().Str("component", "reload").Logger()}
}

// Run loads and applies the file, serves until ctx ends, then shuts down
// gracefully: it stops accepting and lets every connection run for up to its
// service's drain_timeout before closing it. An invalid file fails at once.
func (m *Manager) Run(ctx context.Context) error {
	cfg, err := conf.Load(m.path)
	if err != nil {
		return err
	}
	return m.Serve(ctx, cfg)
}

// Serve applies cfg, serves until ctx ends, then shuts down as Run does.
func (m *Manager) Serve(ctx context.Context, cfg *conf.Config) error {
	if err := m.Apply(cfg); err != nil {
		m.srv.Close()
		return err
	}
	<-ctx.Done()
	m.Shutdown()
	return nil
}

// Apply makes cfg the running configuration. On error nothing changes: the
// old snapshot and listeners keep serving.
func (m *Manager) Apply(cfg *conf.Config) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	old := m.ptr.Load()
	next, err := m.build(cfg, old)
	if err != nil {
		return err
	}
	var want []netip.AddrPort
	for _, s := range cfg.Services {
		want = append(want, s.Listen...)
	}
	ch, err := m.srv.Prepare(want)
	if err != nil {
		return err
	}
	m.ptr.Store(next)
	opened, closed := ch.Commit()
	m.settle(old, next)
	m.log.Info().Uint64("generation", next.Gen).Int("services", len(next.Services)).
		Int("listeners_opened", len(opened)).Int("listeners_closed", len(closed)).
		Dur("took", time.Since(start)).Msg("configuration applied")
	return nil
}

// build turns cfg into the next table. Backends are taken from the pool by
// (service, name), so a kept backend keeps its live state.
func (m *Manager) build(cfg *conf.Config, old *sched.Table) (*sched.Table, error) {
	var gen uint64 = 1
	if old != nil {
		gen = old.Gen + 1
	}
	services := make([]*sched.Service, 0, len(cfg.Services))
	listen := map[netip.AddrPort]*sched.Service{}
	for _, cs := range cfg.Services {
		targets := make([]sched.Target, len(cs.Backends))
		for i, b := range cs.Backends {
			targets[i] = sched.Target{B: m.pool.Get(cs.Name, b.Name), Addr: b.Addr, Weight: b.Weight}
		}
		svc := &sched.Service{
			Name:           cs.Name,
			Scheduler:      cs.Scheduler,
			Options:        sched.Options{Choices: cs.Choices, HashKey: cs.HashKey, TableSize: cs.TableSize},
			Targets:        targets,
			ConnectTimeout: cs.ConnectTimeout,
			IdleTimeout:    cs.IdleTimeout,
			Retries:        cs.Retries,
			DrainTimeout:   cs.DrainTimeout,
			AccessLog:      cfg.Log.Access,
		}
		var prev sched.Picker
		if old != nil {
			if ps := old.Service(cs.Name); ps != nil && ps.Scheduler == cs.Scheduler {
				if slices.Equal(ps.Targets, targets) && ps.Options == svc.Options {
					// Unchanged: keep the picker, and so its cursor.
					svc.Targets, svc.Picker = ps.Targets, ps.Picker
				}
				prev = ps.Picker
			}
		}
		if svc.Picker == nil {
			p, err := sched.New(cs.Scheduler, targets, prev, svc.Options)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", cs.Name, err)
			}
			svc.Picker = p
		}
		services = append(services, svc)
		for _, a := range cs.Listen {
			listen[a] = svc
		}
	}
	return sched.NewTable(gen, services, listen), nil
}

// settle runs after a swap: backends of the old table that the new one no
// longer names start draining; draining ones that came back are undrained.
func (m *Manager) settle(old, next *sched.Table) {
	kept := map[*backend.Backend]bool{}
	for _, s := range next.Services {
		for _, t := range s.Targets {
			kept[t.B] = true
			if t.B.Draining() {
				t.B.Undrain()
			}
		}
	}
	if old == nil {
		return
	}
	for _, s := range old.Services {
		for _, t := range s.Targets {
			if !kept[t.B] {
				kept[t.B] = true // once, even if listed twice
				m.drain(t.B, s.DrainTimeout)
			}
		}
	}
}

// drain stops new connections to b and closes what is still open after
// timeout (0 = wait for them to end).
func (m *Manager) drain(b *backend.Backend, timeout time.Duration) {
	b.StopNew() // at once, not when the goroutine gets to run
	m.drains.Add(1)
	go func() { // exits when b's sessions have ended or been closed
		defer m.drains.Done()
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		active := b.Active()
		closed := b.Drain(ctx)
		m.pool.Forget(b)
		e := m.log.Info()
		if active == 0 {
			e = m.log.Debug()
		}
		e.Str("service", b.Service).Str("backend", b.Name).Int64("open_at_start", active).
			Int("closed_at_deadline", closed).Msg("backend drained")
	}()
}

// Shutdown stops accepting on every listener and drains every backend, each
// for its service's drain_timeout, then waits for all sessions to end.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.srv.Close()
	if t := m.ptr.Load(); t != nil {
		for _, s := range t.Services {
			for _, tg := range s.Targets {
				m.drain(tg.B, s.DrainTimeout)
			}
		}
	}
	m.drains.Wait()
	m.srv.Wait()
}
