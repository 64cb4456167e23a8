// Package reload is the sole writer of fulcrum's snapshot. It watches the
// configuration file, turns each new version into the next sched.Table,
// opens the listeners that are new, swaps the table in atomically, closes
// the listeners that were removed, and drains the backends that were removed.
// A reload never touches an established connection, and a bad file is
// refused while the running configuration keeps serving.
//
// Typical use (main does this):
//
//	var ptr atomic.Pointer[sched.Table]
//	srv := listener.New(&ptr, log)
//	m := reload.New(path, &ptr, srv, log)
//	m.Hup = hupSignals // optional: SIGHUP reloads at once
//	err := m.Run(ctx, cfg) // applies cfg, follows the file until ctx ends, then shuts down
//
// Ownership: Run owns the file watcher, the debounce timer, the recheck
// ticker and every drain goroutine; all are gone when Run returns. main owns
// the atomic pointer and the Server.
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
	// Hup, if set before Run, reloads the file at once on every receive,
	// even when its content looks unchanged (host names are re-resolved).
	Hup <-chan struct{}
	// Notify, if set before Run, is told of reloads in sd_notify terms
	// ("RELOADING=1…", "READY=1…"). A nil Notify is a no-op.
	Notify func(state string) error
	// OnLog, if set, applies the reloadable [log] settings (level) of each
	// configuration that is applied.
	OnLog func(conf.Log)

	path string
	ptr  *atomic.Pointer[sched.Table]
	srv  *listener.Server
	log  zerolog.Logger
	pool backend.Pool

	mu      sync.Mutex // serialises Apply and Shutdown; protects cur
	cur     *conf.Config
	drains  sync.WaitGroup
	stopped bool // Shutdown has run

	statusMu sync.Mutex // protects status
	status   Status
}

// Status describes the reload history, for status views.
type Status struct {
	Generation  uint64    // of the running table; 0 before the first apply
	Applied     time.Time // when that generation was applied
	Reloads     uint64    // reloads applied, the first configuration excluded
	Failed      uint64    // reloads refused
	LastError   string    // why the last attempt was refused; "" if it was applied
	LastAttempt time.Time
}

// New returns a Manager for the file at path.
func New(path string, ptr *atomic.Pointer[sched.Table], srv *listener.Server, log zerolog.Logger) *Manager {
	return &Manager{path: path, ptr: ptr, srv: srv, log: log.With().Str("component", "reload").Logger()}
}

// Status returns the reload history.
func (m *Manager) Status() Status {
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	return m.status
}

func (m *Manager) notify(state string) {
	if m.Notify != nil {
		if err := m.Notify(state); err != nil {
			m.log.Warn().Err(err).Msg("sd_notify failed")
		}
	}
}

// Apply makes cfg the running configuration: build the next table, bind the
// new listeners, swap, close removed listeners, drain removed backends. On
// error nothing changes: the old table and listeners keep serving.
func (m *Manager) Apply(cfg *conf.Config) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return fmt.Errorf("shutting down")
	}
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
	d := diff(old, next) // before settle: removed backends still show their open connections
	m.ptr.Store(next)
	opened, closed := ch.Commit()
	m.settle(old, next)
	if m.OnLog != nil {
		m.OnLog(cfg.Log)
	}
	if m.cur != nil && m.cur.Log.Format != cfg.Log.Format {
		m.log.Warn().Str("running", m.cur.Log.Format).Str("file", cfg.Log.Format).
			Msg("log.format changes only at restart; keeping the running format")
	}
	m.cur = cfg
	took := time.Since(start)

	m.statusMu.Lock()
	if old != nil {
		m.status.Reloads++
	}
	m.status.Generation, m.status.Applied = next.Gen, time.Now()
	m.status.LastError, m.status.LastAttempt = "", m.status.Applied
	m.statusMu.Unlock()

	e := m.log.Info().Uint64("generation", next.Gen).Float64("took_ms", float64(took.Microseconds())/1000)
	d.log(e, opened, closed)
	if old == nil {
		e.Int("services", len(next.Services)).Msg("configuration applied")
	} else {
		e.Msg("reload applied")
	}
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
			Targets:        targets,
			ConnectTimeout: cs.ConnectTimeout,
			IdleTimeout:    cs.IdleTimeout,
			Retries:        cs.Retries,
			DrainTimeout:   cs.DrainTimeout,
			AccessLog:      cfg.Log.Access,
			Parked:         cs.Copy == "parked",
		}
		var prev sched.Picker
		if old != nil {
			if ps := old.Service(cs.Name); ps != nil && ps.Scheduler == cs.Scheduler {
				if slices.Equal(ps.Targets, targets) {
					// Unchanged: keep the picker, and so its cursor.
					svc.Targets, svc.Picker = ps.Targets, ps.Picker
				}
				prev = ps.Picker
			}
		}
		if svc.Picker == nil {
			p, err := sched.New(cs.Scheduler, targets, prev)
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
// Later Apply calls fail.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.stopped {
		m.stopped = true
		m.srv.Close()
		if t := m.ptr.Load(); t != nil {
			for _, s := range t.Services {
				for _, tg := range s.Targets {
					m.drain(tg.B, s.DrainTimeout)
				}
			}
		}
	}
	m.drains.Wait()
	m.srv.Wait()
}
