// Package reload is the sole writer of fulcrum's snapshot. It watches the
// configuration file, turns each new version into the next snapshot (a
// sched.Table and each service's listener.Policy), opens the listeners
// that are new, swaps the snapshot in atomically, closes
// the listeners that were removed, and drains the backends that were removed.
// A reload never touches an established connection, and a bad file is
// refused while the running configuration keeps serving.
//
// Typical use (main does this; Example compiles it):
//
//	srv := listener.New(log)
//	m := reload.New(path, srv, log, reload.Options{Hup: hupSignals}) // SIGHUP reloads at once
//	err := m.Run(ctx, cfg) // applies cfg, follows the file until ctx ends, then shuts down
//
// Ownership: Run owns the file watcher, the debounce timer, the recheck
// ticker and every drain goroutine; all are gone when Run returns. main owns
// the Server, which holds the published snapshot (Server.Snapshot); the
// Manager publishes to it and reads it back, nothing else writes it.
package reload

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/health"
	"fulcrum/listener"
	"fulcrum/sched"
	"fulcrum/statefile"
	"fulcrum/status"
	"fulcrum/systemd"
)

// Options are a Manager's collaborators and settings, fixed at New; the
// zero value of each field is valid.
type Options struct {
	// Hup reloads the file at once on every receive, even when its content
	// looks unchanged (host names are re-resolved). nil: only the file's
	// events and the recheck reload.
	Hup <-chan struct{}
	// Notify is told of reloads in sd_notify terms ("RELOADING=1…",
	// "READY=1…"). nil is a no-op.
	Notify func(state string) error
	// OnLog applies the reloadable [log] settings (level) of each
	// configuration that is applied. nil: none.
	OnLog func(conf.Log)
	// Watchdog is how often to send WATCHDOG=1 (half of WATCHDOG_USEC). A
	// ping is sent only when the accept loops have answered the Server's
	// heartbeat and Run's loop is running. 0: no pings.
	Watchdog time.Duration
	// Alive is the liveness probe the watchdog ping depends on: it reports
	// whether every accept loop has answered within maxAge. nil is the
	// Server's own (listener.Server.Alive).
	Alive func(maxAge time.Duration) bool
	// Lookup resolves backend host names; nil is the system resolver.
	Lookup LookupFunc
	// ResolveTimeout bounds one round of name resolution (every name at
	// once); 0 is DefaultResolveTimeout.
	ResolveTimeout time.Duration
	// State is [admin] state_file: the first commit restores what it read,
	// every commit and change marks it to be written, and Run runs its
	// writer. nil keeps nothing.
	State *statefile.File
	// Instance reports the instance's drain for the state file: who drained
	// it and since when, ok false when it is not drained by an operator.
	// nil: never drained.
	Instance func() (by string, since time.Time, ok bool)
	// Sockets names the listening sockets passed by systemd
	// (FileDescriptorName= → addresses; handover.Upgrader.Sockets): a
	// service of that name also listens on them, whatever its listen list
	// says.
	Sockets map[string][]netip.AddrPort

	// newWatcher, if set, replaces newWatcher: a test creates the watcher
	// under a lowered inotify queue with it.
	newWatcher func() (*watcher, error)
}

// Manager applies configurations, one at a time.
type Manager struct {
	opt   Options
	path  string
	srv   *listener.Server
	log   zerolog.Logger
	ovlog zerolog.Logger // overrides, under component "state"

	pool   backend.Pool
	health *health.Controller // the checks, passive expiry, slow start and transitions; Run runs it
	watch  status.Watcher     // each service's own state (fallback, holding), read after every swap

	mu         sync.Mutex // serialises Apply, refresh and Shutdown; protects cur, dns and stopped
	cur        *conf.Config
	dns        names // the host name resolutions the running table uses
	drains     sync.WaitGroup
	stopped    bool            // Shutdown has run
	drainCtx   context.Context // parent of every drain; ended by stopDrains when Shutdown's context ends
	stopDrains context.CancelFunc
	seq        atomic.Uint64          // the last Table.Seq handed out
	writers    map[string]writerState // failback: each such service's writer (failback.go); replaced whole at each commit
	promote    map[string]promotion   // failback: Promote's wishes, for the next build
	started    time.Time              // the first commit: health known before it counts from it (failback)
	ready      chan struct{}          // closed by Run once it serves (Ready)
	failback   *time.Timer            // the next after: failback's refresh; nil when none is due

	statusMu sync.Mutex // protects status and draining
	status   Status
	draining map[*backend.Backend]status.Drain // backends whose drain goroutine runs, for status views
}

// Status describes the reload history, for status views: the history part
// of the one status type.
type Status = status.Reload

// New returns a Manager for the file at path, which publishes its
// snapshots to srv (Server.Publish). opt is fixed from here on. The
// writers of failback services are taken back from opt.State.
func New(path string, srv *listener.Server, log zerolog.Logger, opt Options) *Manager {
	m := &Manager{opt: opt, path: path, srv: srv, ready: make(chan struct{}), log: log.With().Str("component", "reload").Logger(),
		ovlog: log.With().Str("component", "state").Logger()}
	if ws := opt.State.Restored().Writers; len(ws) > 0 {
		m.writers = map[string]writerState{}
		for _, w := range ws {
			m.writers[w.Service] = writerState{w.Backend, w.Since} // the first build keeps it if it is up (failback.go)
		}
	}
	m.drainCtx, m.stopDrains = context.WithCancel(context.Background())
	m.health = health.New(log, m.Table, m.refresh)
	m.pool.Changes = m.health.Changes()
	m.watch.Log, m.watch.Events = log.With().Str("component", "service").Logger(), &m.pool.Events
	return m
}

// hostOf is the backend's address as written when it is a host name.
func hostOf(b conf.Backend) string {
	if b.Host == "" {
		return ""
	}
	return b.Address
}

// Events returns the last state changes of backends and services, oldest
// first: the pool's ring, which outlives reloads.
func (m *Manager) Events() []backend.Event { return m.pool.Events.List() }

// Watcher follows each service's own state (fallback, holding) from one
// table to the next.
func (m *Manager) Watcher() *status.Watcher { return &m.watch }

// Ready is closed once Run has applied its first configuration and
// follows the file: when it tells systemd READY=1. A Run that fails to
// start never closes it.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Table returns the running table; nil before the first Apply.
func (m *Manager) Table() *sched.Table {
	if s := m.srv.Snapshot(); s != nil {
		return s.Table
	}
	return nil
}

// publish swaps in p's table with its policies (the Server wakes the
// connections held for a backend to look at it).
func (m *Manager) publish(p *plan) *listener.Snapshot {
	next := listener.NewSnapshot(p.table, p.policies)
	m.srv.Publish(next)
	return next
}

// current returns the running configuration.
func (m *Manager) current() *conf.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// refresh rebuilds the running configuration's table at the same
// generation (and a new Seq): effective weights follow health and slow
// start.
func (m *Manager) refresh() {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.Table()
	if m.stopped || m.cur == nil || old == nil {
		return
	}
	p, err := m.build(m.cur, m.dns, old, old.Gen, time.Now())
	if err != nil {
		m.log.Error().Err(err).Msg("cannot rebuild the table after a health change")
		return
	}
	p.draft.Commit() // nothing new: the running configuration's backends all exist
	m.swapped(old, m.publish(p))
	m.commitWriters(p)
	m.opt.State.Changed() // health may have changed
}

// StatusLine is the one-line summary systemd shows (STATUS=): generation,
// services, backends up of total, open connections, and the last reload
// error if the last attempt failed.
func (m *Manager) StatusLine() string {
	return status.Of(status.Source{Snapshot: m.srv.Snapshot, Reloads: m.Status, Draining: m.Draining}).Line()
}

// Draining returns the backends being drained now (removed from the
// configuration, or all of them at shutdown), each with its deadline.
func (m *Manager) Draining() []status.Drain {
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	out := make([]status.Drain, 0, len(m.draining))
	for _, d := range m.draining {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b status.Drain) int {
		return cmp.Or(cmp.Compare(a.B.Service, b.B.Service), cmp.Compare(a.B.Name, b.B.Name))
	})
	return out
}

// Status returns the reload history.
func (m *Manager) Status() Status {
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	return m.status
}

func (m *Manager) notify(state string) {
	if m.opt.Notify != nil {
		if err := m.opt.Notify(state); err != nil {
			m.log.Warn().Err(err).Msg("sd_notify failed")
		}
	}
}

// Apply makes cfg the running configuration, as a transaction: build
// computes the next table and all it needs without touching anything live,
// the new listeners are bound, and only then is anything committed: the
// swap, new backends into the pool, accept rates, removed listeners closed,
// removed backends drained, health checks restarted. On error nothing
// changes: the old table, listeners, pool and admission state keep serving
// exactly as they were.
//
// Apply resolves cfg's host names itself, waiting up to ResolveTimeout;
// Run resolves them off its loop and calls apply.
func (m *Manager) Apply(cfg *conf.Config) error {
	return m.apply(cfg, lookupAll(context.Background(), m.lookup(), cfg.Names(), m.resolved(), m.resolveTimeout()), "")
}

func (m *Manager) lookup() LookupFunc {
	if m.opt.Lookup != nil {
		return m.opt.Lookup
	}
	return defaultLookup
}

func (m *Manager) resolveTimeout() time.Duration {
	if m.opt.ResolveTimeout > 0 {
		return m.opt.ResolveTimeout
	}
	return DefaultResolveTimeout
}

// resolved returns the resolutions the running table uses.
func (m *Manager) resolved() names {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dns
}

// apply is Apply with cfg's host names already resolved (dns). trigger says
// what started it, for the log ("" for a direct call).
func (m *Manager) apply(cfg *conf.Config, dns names, trigger string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return fmt.Errorf("shutting down")
	}
	start := time.Now()
	old := m.Table()
	var gen uint64 = 1
	if old != nil {
		gen = old.Gen + 1
	}
	p, err := m.build(cfg, dns, old, gen, start)
	if err != nil {
		return err
	}
	if err := m.checkSources(context.Background(), cfg, p); err != nil { // source = "client": source.go
		return err
	}
	var want []netip.AddrPort
	for _, s := range p.table.Services {
		want = append(want, s.Listen...)
	}
	ch, err := m.srv.Prepare(want, cfg.Cluster.Freebind)
	if err != nil {
		return err
	}

	// Commit: from here nothing fails.
	d := diff(old, p.table) // before settle: removed backends still show their open connections
	d.settings = settingChanges(m.cur, cfg)
	p.draft.Commit()
	for b, err := range p.addrErrs { // before the swap: a backend with no address is never eligible
		b.SetAddressError(err, start)
	}
	m.dns = dns
	m.opt.State.Restore(p.table) // the first commit only; before the swap: a backend down before a restart takes nothing
	health.AwaitRoles(p.jobs)    // before the swap: a node not asked yet takes nothing
	m.swapped(old, m.publish(p))
	m.commitWriters(p)
	opened, closed := ch.Commit()
	m.settle(old, p.table)
	m.health.SetChecks(p.jobs)
	m.health.Kick()
	if m.opt.OnLog != nil {
		m.opt.OnLog(cfg.Log)
	}
	if m.cur != nil && !m.cur.Admin.Equal(cfg.Admin) {
		m.log.Warn().Msg("[admin] changes only at restart; keeping the running admin listener")
	}
	if m.cur != nil && m.cur.Process != cfg.Process {
		m.log.Warn().Int("running", m.cur.Process.Loops).Int("file", cfg.Process.Loops).
			Msg("[process] changes only at restart; keeping the running event loops")
	}
	if m.cur != nil && m.cur.Log.Format != cfg.Log.Format {
		m.log.Warn().Str("running", string(m.cur.Log.Format)).Str("file", string(cfg.Log.Format)).
			Msg("log.format changes only at restart; keeping the running format")
	}
	m.cur = cfg
	m.opt.State.Changed()
	took := time.Since(start)

	m.statusMu.Lock()
	if old != nil {
		m.status.Reloads++
	}
	m.status.Generation, m.status.Applied = p.table.Gen, time.Now()
	m.status.LastError, m.status.LastAttempt = "", m.status.Applied
	m.statusMu.Unlock()

	e := m.log.Info().Uint64("generation", p.table.Gen).Uint64("table", p.table.Seq).Float64("took_ms", float64(took.Microseconds())/1000)
	if trigger != "" {
		e = e.Str("trigger", trigger)
	}
	d.log(e, opened, closed)
	if old == nil {
		e.Int("services", len(p.table.Services)).Msg("configuration applied")
	} else {
		e.Msg("reload applied")
		why := "reload applied"
		if trigger != "" {
			why += " (" + trigger + ")"
		}
		m.pool.Events.Add(backend.Event{At: time.Now(), From: fmt.Sprintf("generation %d", old.Gen),
			To: fmt.Sprintf("generation %d", p.table.Gen), Reason: why})
	}
	return nil
}

// plan is everything one configuration needs, computed by build without
// touching live state; Apply commits it once the listeners are bound.
type plan struct {
	table    *sched.Table
	policies map[string]*listener.Policy // each service's connection policy, by name
	jobs     []health.Job
	draft    *backend.Draft // the backends (and WAL clocks) the table names, new ones not yet in the pool
	// addrErrs holds, for every backend named by a host name, why it has no
	// address (nil: it has one); set on the backend at commit.
	addrErrs map[*backend.Backend]error
	// failback (failback.go): each failback service's writer, the moves
	// decided, and when the next after: failback is due (zero: none).
	writers     map[string]writerState
	moves       []writerMove
	failbackDue time.Time
}

// build turns cfg into a plan for a table of generation gen. Backends are
// taken from the pool by (service, name) through a draft, so a kept backend
// keeps its live state and a new one joins the pool only at commit.
// Weights are effective weights at now: 0 for a backend that is down (as
// LVS quiesces one, so that weighted cycles share its slots fairly), and
// ramped during slow start. build reads live state (health) but changes
// none.
func (m *Manager) build(cfg *conf.Config, dns names, old *sched.Table, gen uint64, now time.Time) (*plan, error) {
	p := &plan{draft: m.pool.Draft(), addrErrs: map[*backend.Backend]error{}, policies: map[string]*listener.Policy{}}
	services := make([]*sched.Service, 0, len(cfg.Services))
	listen := map[netip.AddrPort]*sched.Service{}
	for _, cs := range cfg.Services {
		var prim, back []sched.Target
		wal := m.health.WAL(cs.Name)
		for _, b := range cs.Backends {
			bk := p.draft.Get(cs.Name, b.Name)
			addr, aerr := dns.addr(b.Host, b.Addr)
			if b.Host != "" {
				p.addrErrs[bk] = aerr
			}
			t := sched.Target{B: bk, Addr: addr, Host: hostOf(b), Base: b.Weight, Weight: health.EffectiveWeight(b.Weight, b.SlowStart, bk, now), SlowStart: b.SlowStart,
				MaxConns: b.MaxConns, MaxFails: b.MaxFails, FailTimeout: b.FailTimeout,
				ProxyProtocol: b.ProxyProtocol,
				CutOnDown:     b.OnDown == conf.OnDownClose, CutBackupsOnUp: b.OnUp == conf.OnUpCloseBackups, CutOnRole: b.OnRoleChange == conf.OnRoleChangeClose}
			if aerr != nil {
				t.Weight = 0 // no address: never picked, whatever its health says
			}
			if b.Backup {
				back = append(back, t)
			} else {
				prim = append(prim, t)
			}
			if b.Health.Check != health.CheckNone {
				spec := checkSpec(b, dns)
				spec.Probe.WAL = wal // the service's checks share where its primary is
				name := cs.Name
				spec.Passed = func() { m.srv.Kick(name) }
				p.jobs = append(p.jobs, health.Job{B: bk, Spec: spec})
			}
		}
		svc := &sched.Service{
			Name:         cs.Name,
			Scheduler:    cs.Scheduler,
			Options:      sched.Options{Choices: cs.Choices, HashKey: cs.HashKey, TableSize: cs.TableSize},
			DrainTimeout: cs.DrainTimeout,
		}
		p.policies[cs.Name] = policy(cfg, cs)
		svc.SplitBrain, svc.SplitWriter = singleWriter(cs, prim, back)
		m.planWriter(p, &cs, svc, prim, now) // before the picker's reuse is decided: a new writer is a new picker
		var prevP, prevB *sched.Service
		if old != nil {
			if ps := old.Service(cs.Name); ps != nil && ps.Scheduler == cs.Scheduler && ps.Options == svc.Options {
				prevP = ps
				prevB = &sched.Service{Targets: ps.Backups, Picker: ps.BackupPicker}
			}
		}
		var err error
		if svc.Targets, svc.Picker, err = picker(cs.Scheduler, svc.Options, prim, prevP); err != nil {
			return nil, fmt.Errorf("service %s: %w", cs.Name, err)
		}
		if len(back) > 0 {
			if svc.Backups, svc.BackupPicker, err = picker(cs.Scheduler, svc.Options, back, prevB); err != nil {
				return nil, fmt.Errorf("service %s: %w", cs.Name, err)
			}
		}
		services = append(services, svc)
		svc.Listen = slices.Clone(cs.Listen)
		for _, a := range m.opt.Sockets[cs.Name] {
			if !slices.Contains(svc.Listen, a) {
				svc.Listen = append(svc.Listen, a)
			}
		}
		for _, a := range svc.Listen {
			if listen[a] == nil { // a routed address: any of its services (they agree on accept_proxy)
				listen[a] = svc
			}
		}
	}
	for i, cs := range cfg.Services {
		if cs.Fallback != "" {
			services[i].Fallback = services[slices.IndexFunc(services, func(s *sched.Service) bool { return s.Name == cs.Fallback })] // conf checked the name
		}
	}
	p.table = sched.NewTable(gen, services, listen)
	if err := routes(cfg, p.table); err != nil {
		return nil, err
	}
	p.table.Seq = m.seq.Add(1)
	return p, nil
}

// policy is the connection policy of service cs in cfg.
func policy(cfg *conf.Config, cs conf.Service) *listener.Policy {
	return &listener.Policy{
		AcceptProxy:       cs.AcceptProxy,
		ProxyTimeout:      cs.ProxyTimeout,
		Allow:             cs.Allow,
		Deny:              cs.Deny,
		MaxConns:          cs.MaxConns,
		QueueTimeout:      cs.QueueTimeout,
		MaxConnsPerSource: cs.MaxConnsPerSource,
		AcceptRate:        cs.AcceptRate,
		AcceptBurst:       cs.AcceptBurst,
		ConnectTimeout:    cs.ConnectTimeout,
		Retries:           cs.Retries,
		HoldTimeout:       cs.HoldTimeout,
		IdleTimeout:       cs.IdleTimeout,
		HalfCloseTimeout:  cs.HalfCloseTimeout,
		KeepAliveIdle:     cs.KeepAliveIdle,
		KeepAliveInterval: cs.KeepAliveInterval,
		KeepAliveCount:    cs.KeepAliveCount,
		UserTimeout:       cs.UserTimeout,
		AccessLog:         cfg.Log.Access,
		Postgres:          speaksPostgres(cs),
		PrereadTimeout:    cs.PrereadTimeout,
		SourceClient:      cs.Source.Client,
	}
}

// picker builds the scheduler over targets, or keeps prev's when its
// targets are the same (and so its cursor). prev may be nil.
func picker(name sched.Kind, opt sched.Options, targets []sched.Target, prev *sched.Service) ([]sched.Target, sched.Picker, error) {
	var last sched.Picker
	if prev != nil && prev.Picker != nil {
		if slices.Equal(prev.Targets, targets) {
			return prev.Targets, prev.Picker, nil
		}
		last = prev.Picker
	}
	p, err := sched.New(name, targets, last, opt)
	return targets, p, err
}

// checkSpec is b's active check. A check host name without an address is
// dialled by name, so the probe fails (or succeeds) in its own goroutine.
func checkSpec(b conf.Backend, dns names) health.CheckSpec {
	h := b.Health
	addr := b.CheckAddr.String()
	if b.CheckHost != "" {
		if a, err := dns.addr(b.CheckHost, b.CheckAddr); err == nil {
			addr = a.String()
		} else {
			addr = net.JoinHostPort(b.CheckHost, strconv.Itoa(int(b.CheckAddr.Port())))
		}
	}
	p := health.Probe{Kind: h.Check, Addr: addr, Timeout: h.Timeout, Path: h.Path, Status: h.Status, User: h.User,
		Role: h.Role, PasswordFile: h.PasswordFile, Database: h.Database, MaxLag: h.MaxLag, TLS: h.TLS,
		Sentinels: h.Sentinels, MasterName: h.MasterName}
	if h.SendProxy {
		p.SendProxy = b.ProxyProtocol
	}
	if h.PatroniPort != 0 {
		host, _, _ := net.SplitHostPort(addr)
		p.Patroni = net.JoinHostPort(host, strconv.Itoa(h.PatroniPort))
	}
	if len(h.Sentinels) > 0 {
		p.Backend = b.Addr.String() // what the Sentinels name: the backend's own address, resolved
		if b.Host != "" {
			if a, err := dns.addr(b.Host, b.Addr); err == nil {
				p.Backend = a.String()
			} else {
				p.Backend = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Addr.Port())))
			}
		}
	}
	if p.TLS.On && p.TLS.ServerName == "" && b.CheckHost != "" {
		p.TLS.ServerName = b.CheckHost // the name the certificate carries, not the address it resolved to
	}
	if h.Check == health.CheckSendExpect {
		p.Send = []byte(h.Send)
		p.Expect = h.Expect
	}
	return health.CheckSpec{Probe: p, Interval: h.Interval, Rise: h.Rise, Fall: h.Fall}
}

// settle runs after a swap: backends of the old table that the new one no
// longer names start draining; draining ones that came back are undrained.
func (m *Manager) settle(old, next *sched.Table) {
	kept := map[*backend.Backend]bool{}
	now := time.Now()
	for _, s := range next.Services {
		for _, t := range s.All() {
			kept[t.B] = true
			if t.B.Draining() {
				t.B.Undrain()
			}
			t.B.NoteWeight(t.Base, now) // a drain by weight 0 is dated from the table that made it
		}
	}
	if old == nil {
		return
	}
	for _, s := range old.Services {
		for i, t := range s.All() {
			if !kept[t.B] {
				kept[t.B] = true // once, even if listed twice
				if o, _, _ := t.B.Override(); o != backend.Ready {
					t.B.SetOverride(backend.Ready, "removal", time.Now()) // an override ends with its backend
					m.log.Info().Str("service", s.Name).Str("backend", t.B.Name).Str("was", o.String()).Msg("override cleared: backend removed")
				}
				m.drain(t, i >= len(s.Targets), s.DrainTimeout, nil)
			}
		}
	}
}

// drain stops new connections to t's backend and closes what is still open
// after timeout (0 = wait for them to end), or as soon as Shutdown's context
// ends. Until then the backend is listed by Draining. With after not nil
// (Shutdown: the listeners are closed), new connections are stopped only
// once after is closed, or at the deadline: the connections accepted
// before then are still being admitted, and are served, then drained.
func (m *Manager) drain(t sched.Target, backup bool, timeout time.Duration, after <-chan struct{}) {
	b := t.B
	if after == nil {
		b.StopNew() // at once, not when the goroutine gets to run
	}
	d := status.Drain{B: b, Addr: t.Addr, Backup: backup}
	if timeout > 0 {
		d.Deadline = time.Now().Add(timeout)
	}
	m.statusMu.Lock()
	if m.draining == nil {
		m.draining = map[*backend.Backend]status.Drain{}
	}
	m.draining[b] = d
	m.statusMu.Unlock()
	m.drains.Add(1)
	go func() { // exits when b's sessions have ended or been closed
		defer m.drains.Done()
		defer func() {
			m.statusMu.Lock()
			if m.draining[b] == d { // not a later drain of the same backend
				delete(m.draining, b)
			}
			m.statusMu.Unlock()
		}()
		ctx, cancel := context.WithCancel(m.drainCtx)
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(m.drainCtx, timeout)
		}
		defer cancel()
		if after != nil {
			select {
			case <-after:
			case <-ctx.Done():
			}
			b.StopNew()
		}
		active := b.Active()
		closed := b.Drain(ctx)
		m.pool.Forget(b)
		e := m.log.Info()
		switch {
		case closed > 0: // sessions were cut: worth seeing
			e = m.log.Warn()
		case active == 0:
			e = m.log.Debug()
		}
		e.Str("service", b.Service).Str("backend", b.Name).Int64("open_at_start", active).
			Int("closed_at_deadline", closed).Msg("backend drained")
	}()
}

// Shutdown stops accepting on every listener and drains every backend, each
// for its service's drain_timeout, then waits for all sessions to end. A
// connection accepted before the listeners closed (reading its PROXY header
// or ClientHello, queued, held, dialling) is still admitted and served: the
// backends stop taking new connections once no admission is left (or at
// their drain deadline), not at once. When
// ctx ends first, every session still open is closed at once and Shutdown
// returns ctx's error once they are gone (as http.Server.Shutdown does).
// Later Apply calls fail; a second Shutdown waits like the first.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if !m.stopped {
		m.stopped = true
		if m.failback != nil {
			m.failback.Stop()
			m.failback = nil
		}
		m.notify(systemd.Stopping)
		m.srv.Close()
		var open int64
		var longest time.Duration
		if t := m.Table(); t != nil {
			for _, s := range t.Services {
				longest = max(longest, s.DrainTimeout)
				for _, tg := range s.All() {
					open += tg.B.Active()
				}
			}
		}
		m.log.Info().Int64("open", open).Stringer("drain_timeout", longest).Msg("stopped accepting; draining connections")
		m.health.Stop()
		admitted := m.srv.Admitted() // after Close: no connection is accepted any more
		if t := m.Table(); t != nil {
			for _, s := range t.Services {
				for i, tg := range s.All() {
					m.drain(tg, i >= len(s.Targets), s.DrainTimeout, admitted)
				}
			}
		}
	}
	m.mu.Unlock()
	done := make(chan struct{})
	go func() { // exits when every check, drain and session has ended
		m.drains.Wait()
		m.srv.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		m.stopDrains() // each drain closes what is left of its backend's sessions
		<-done
		return ctx.Err()
	}
}
