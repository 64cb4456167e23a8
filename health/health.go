// Package health is where fulcrum's health checks live: the probes of
// every kind (check*.go: tcp, send-expect, http, pgsql, mysql and Galera,
// redis and Sentinel, Patroni; over TLS, with a PROXY header), the
// replication lag they measure (lag.go, wal.go), the loop that runs them
// (RunChecks) and the Sentinel event subscriptions that wake them. Beside
// them is the health controller: it runs the active check goroutines of
// the running configuration, lifts passive marks when their fail_timeout
// passes, steps slow-start weights up, and turns each backend transition
// into a table rebuild, one log line and the session cuts the
// configuration asks for (on_down, on_up, on_role_change, and a split
// brain's claimants: cut.go).
//
// health probes and decides; the state a result sets (up, down, wrong
// role, the rise and fall counts, the lag, the check counters) lives with
// each backend.Backend (Checked), so it survives reloads, and the
// connection path reads it without importing a probe.
//
// It does not build tables: Rebuild, given by its owner (reload), rebuilds
// the running configuration's table at the same generation with effective
// weights that follow health.
//
// Typical use: see Example (reload does this, with m.Table and m.refresh
// as table and rebuild).
//
// Ownership: Run's caller owns its goroutine; the controller owns every
// check goroutine, which SetChecks replaces and Stop ends.
package health

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/sched"
)

// Job is one backend's active check.
type Job struct {
	B    *backend.Backend
	Spec CheckSpec
}

// Controller drives the health of the running table's backends.
type Controller struct {
	log     zerolog.Logger
	table   func() *sched.Table // the running table
	rebuild func()              // rebuild it at the same generation
	changes chan *backend.Backend
	kick    chan struct{} // a new table: recompute the timers

	mu      sync.Mutex // protects stop, stopped and clocks
	stop    context.CancelFunc
	stopped bool
	checks  sync.WaitGroup       // the check goroutines
	clocks  map[string]*WALClock // by service: the clocks the running checks share (see WAL)
}

// New returns a controller over the tables table returns, which calls
// rebuild after a transition or a slow-start step.
func New(log zerolog.Logger, table func() *sched.Table, rebuild func()) *Controller {
	return &Controller{log: log.With().Str("component", "health").Logger(), table: table, rebuild: rebuild,
		changes: make(chan *backend.Backend, 4096), kick: make(chan struct{}, 1)}
}

// Changes is where backends report their transitions (backend.Pool's
// Changes).
func (c *Controller) Changes() chan<- *backend.Backend { return c.changes }

// Kick tells Run that a new table is live: passive expiries and slow-start
// steps are scheduled from it. It never blocks.
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default: // one pending kick is enough
	}
}

// WAL is the clock the checks of service share (Probe.WAL): the running
// checks' one, so that what they learned of its primaries outlives a
// reload, or a new one. SetChecks keeps the clocks its jobs use. It reads
// the controller's state but changes none: a reload's build calls it.
func (c *Controller) WAL(service string) *WALClock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.clocks[service]; w != nil {
		return w
	}
	return &WALClock{}
}

// SetChecks ends the running checks and starts jobs, one goroutine each. A
// backend of the running table whose checks are now off is no longer held
// down by them. After Stop it does nothing.
func (c *Controller) SetChecks(jobs []Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	c.clocks = map[string]*WALClock{}
	for _, j := range jobs {
		if w := j.Spec.Probe.WAL; w != nil {
			c.clocks[j.B.Service] = w
		}
	}
	checked := map[*backend.Backend]bool{}
	if len(jobs) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		c.stop = cancel
		jobs = c.watchSentinels(ctx, jobs)
		for _, j := range jobs {
			checked[j.B] = true
			c.checks.Add(1)
			go func() { // exits when the next SetChecks or Stop cancels ctx
				defer c.checks.Done()
				RunChecks(ctx, j.B, j.Spec)
			}()
		}
	}
	if t := c.table(); t != nil {
		for _, s := range t.Services {
			for _, tg := range s.All() {
				if !checked[tg.B] {
					tg.B.ClearActive()
				}
			}
		}
	}
}

// Stop ends every check and waits for their goroutines; later SetChecks
// calls do nothing.
func (c *Controller) Stop() {
	c.mu.Lock()
	c.stopped = true
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
	c.mu.Unlock()
	c.checks.Wait()
}

// Run serves transitions, passive expiries and slow-start steps until ctx
// ends. A burst of transitions makes one rebuild; each is logged once the
// table reflects it.
func (c *Controller) Run(ctx context.Context) {
	passive := time.NewTimer(time.Hour)
	passive.Stop()
	defer passive.Stop()
	ramp := time.NewTimer(time.Hour)
	ramp.Stop()
	defer ramp.Stop()
	schedule := func() {
		now := time.Now()
		t := c.table()
		if t == nil {
			return
		}
		if next := expirePassive(t, now); !next.IsZero() {
			passive.Reset(next.Sub(now))
		}
		if d := ramping(t, now); d > 0 {
			ramp.Reset(d)
		}
	}
	schedule()
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-c.changes:
			b.Seen() // before the rebuild reads its state: a later change reports again
			changed := []*backend.Backend{b}
			for more := true; more; { // the whole burst, then one rebuild
				select {
				case b := <-c.changes:
					b.Seen()
					changed = append(changed, b)
				default:
					more = false
				}
			}
			c.rebuild()
			for _, b := range changed { // logged once the table reflects it
				c.transition(b)
			}
			schedule()
		case <-passive.C:
			schedule() // expiries report changes, which rebuild
		case <-ramp.C:
			c.rebuild()
			schedule()
		case <-c.kick:
			schedule()
		}
	}
}

// transition logs one backend's change, once, and applies its
// on_role_change, on_down or on_up (see cut.go).
func (c *Controller) transition(b *backend.Backend) {
	_, reason, _ := b.Health()
	st, role := b.State()
	if b.Announce(st) {
		switch st {
		case backend.StateUp:
			c.log.Info().Str("service", b.Service).Str("backend", b.Name).Str("role", role).Str("reason", reason).Msg("backend up")
		case backend.StateWrongRole:
			c.log.Warn().Str("service", b.Service).Str("backend", b.Name).Str("role", role).Str("reason", reason).Msg("backend in the wrong role")
		default:
			e := c.log.Warn()
			if reason == backend.ReasonAwaitingRole {
				e = c.log.Debug() // every start and role change does this for a moment: not news
			}
			e.Str("service", b.Service).Str("backend", b.Name).Str("reason", reason).Msg("backend down")
		}
	}
	c.cut(b, st)
}

// AwaitRoles keeps each backend whose check wants a role, and that no check
// has seen in that role, out of rotation until its next check (see
// backend.AwaitRole): a writer service must not guess. Part of a reload's
// commit, before the swap.
func AwaitRoles(jobs []Job) {
	for _, j := range jobs {
		if r := j.Spec.Probe.Role; r == backend.RolePrimary || r == backend.RoleReplica {
			j.B.AwaitRole(r)
		}
	}
}

// expirePassive lifts the passive marks of t's backends that are due and
// returns when the next one is, or zero.
func expirePassive(t *sched.Table, now time.Time) time.Time {
	var next time.Time
	for _, s := range t.Services {
		for _, tg := range s.All() {
			if n := tg.B.ExpirePassive(now); !n.IsZero() && (next.IsZero() || n.Before(next)) {
				next = n
			}
		}
	}
	return next
}

// EffectiveWeight is a backend's weight as the schedulers see it at now:
// 0 while it is down or held by an operator's drain or maint, and from 10% up to 100% of base during slow start
// after it came up (never below 1).
func EffectiveWeight(base int, slowStart time.Duration, b *backend.Backend, now time.Time) int {
	if o, _, _ := b.Override(); base == 0 || o != backend.Ready {
		return 0
	}
	up, _, since := b.Health()
	if !up {
		return 0
	}
	if slowStart <= 0 || since.IsZero() {
		return base
	}
	elapsed := now.Sub(since)
	if elapsed >= slowStart {
		return base
	}
	frac := 0.1 + 0.9*float64(elapsed)/float64(slowStart)
	return max(1, int(float64(base)*frac+0.5))
}

// ramping reports how soon a weight of t should be stepped up again, or 0.
func ramping(t *sched.Table, now time.Time) time.Duration {
	var next time.Duration
	for _, s := range t.Services {
		for _, tg := range s.All() {
			if tg.SlowStart <= 0 || tg.Base == 0 {
				continue
			}
			if up, _, since := tg.B.Health(); up && !since.IsZero() && now.Sub(since) < tg.SlowStart {
				step := max(tg.SlowStart/20, 100*time.Millisecond)
				if next == 0 || step < next {
					next = step
				}
			}
		}
	}
	return next
}
