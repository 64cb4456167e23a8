package reload

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/systemd"
)

// Run applies cfg (the file as main loaded it), then follows the file until
// ctx ends, and then shuts down gracefully (see Shutdown).
//
// The file's directory is watched, not the file, so every way of replacing
// it is seen: written in place, renamed over (vim, sed -i, Ansible,
// consul-template), a symlink swapped (Kubernetes ConfigMaps swap the
// "..data" link), deleted and recreated. When the path is a symlink the
// directory it resolves to is watched too, so an edit of the target is seen.
// Events are debounced ([reload] debounce of quiet), and a file whose
// content is what was last tried is not reloaded again. inotify can drop
// events, so the file is also re-read every [reload] recheck. A Hup receive
// reloads at once, whatever the content.
func (m *Manager) Run(ctx context.Context, cfg *conf.Config) error {
	r := &runner{m: m, cfg: cfg.Reload, watched: map[string]bool{}}
	lctx, stopLoader := context.WithCancel(ctx)
	r.ld = newLoader(m, cfg.Digest)
	go r.ld.run(lctx) // exits when stopLoader is called, as Run returns
	defer func() { stopLoader(); <-r.ld.done }()
	if m.Watchdog > 0 {
		m.srv.SetHeartbeat(m.Watchdog / 2) // before the first accept loop starts
	}
	// Watch before applying, so that no edit made from here on is missed.
	var events <-chan fsnotify.Event
	var werrs <-chan error
	w, err := fsnotify.NewWatcher()
	if err != nil {
		m.log.Warn().Err(err).Msg("cannot watch the configuration file; reload it with SIGHUP")
	} else {
		defer w.Close()
		r.w, events, werrs = w, w.Events, w.Errors
		r.rewatch()
	}
	if err := m.Apply(cfg); err != nil {
		m.srv.Close()
		return err
	}
	defer m.Shutdown(context.Background())
	m.notify(systemd.Ready + "\n" + systemd.Status(m.StatusLine()))
	r.check(false) // an edit made since main read the file
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	recheck := time.NewTicker(time.Hour)
	defer recheck.Stop()
	r.resetRecheck(recheck)
	resolveTick := time.NewTicker(time.Hour)
	defer resolveTick.Stop()
	r.resetResolve(resolveTick)
	// Health: transitions rebuild the table; passive marks expire on time;
	// slow start steps weights up.
	passive := time.NewTimer(time.Hour)
	passive.Stop()
	defer passive.Stop()
	ramp := time.NewTimer(time.Hour)
	ramp.Stop()
	defer ramp.Stop()
	schedule := func() {
		now := time.Now()
		if next := m.expirePassive(now); !next.IsZero() {
			passive.Reset(next.Sub(now))
		}
		if cfg := m.current(); cfg != nil {
			if d := ramping(cfg, m.ptr.Load(), now); d > 0 {
				ramp.Reset(d)
			}
		}
	}
	schedule()
	var watchdog <-chan time.Time
	if m.Watchdog > 0 {
		t := time.NewTicker(m.Watchdog)
		defer t.Stop()
		watchdog = t.C
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Op != fsnotify.Chmod {
				debounce.Reset(r.cfg.Debounce)
			}
		case err, ok := <-werrs:
			if !ok {
				werrs = nil
				continue
			}
			m.log.Warn().Err(err).Msg("file watcher error; re-reading the configuration")
			debounce.Reset(r.cfg.Debounce) // an overflow may have lost the event we need
		case b := <-m.changes:
			b.Seen() // before the rebuild reads its state: a later change reports again
			changed := []*backend.Backend{b}
			for more := true; more; { // the whole burst, then one rebuild
				select {
				case b := <-m.changes:
					b.Seen()
					changed = append(changed, b)
				default:
					more = false
				}
			}
			m.refresh()
			for _, b := range changed { // logged once the table reflects it
				m.healthChanged(b)
			}
			schedule()
		case <-passive.C:
			schedule() // expiries report changes, which rebuild
		case <-ramp.C:
			m.refresh()
			schedule()
		case <-debounce.C:
			r.check(false)
			r.resetRecheck(recheck)
			schedule()
		case <-recheck.C:
			r.check(false)
		case <-resolveTick.C:
			r.ld.request(loadReq{dns: true})
		case res := <-r.ld.out:
			r.applyLoaded(res)
			r.resetResolve(resolveTick)
			schedule()
		case <-m.Hup:
			debounce.Stop()
			r.check(true)
			r.resetRecheck(recheck)
			schedule()
		case <-watchdog:
			// This loop is running; the accept loops must have answered
			// their heartbeat (every half interval) within two intervals,
			// or systemd hears nothing.
			if m.srv.Alive(2 * m.Watchdog) {
				m.notify(systemd.Watchdog + "\n" + systemd.Status(m.StatusLine()))
			} else {
				m.log.Error().Msg("an accept loop did not answer; withholding the watchdog ping")
			}
		}
	}
}

// healthChanged logs one backend's transition, once.
func (m *Manager) healthChanged(b *backend.Backend) {
	up, reason, _ := b.Health()
	if up {
		m.log.Info().Str("service", b.Service).Str("backend", b.Name).Str("reason", reason).Msg("backend up")
	} else {
		m.log.Warn().Str("service", b.Service).Str("backend", b.Name).Str("reason", reason).Msg("backend down")
	}
}

// expirePassive lifts the passive marks that are due and returns when the
// next one is, or zero.
func (m *Manager) expirePassive(now time.Time) time.Time {
	var next time.Time
	if t := m.ptr.Load(); t != nil {
		for _, s := range t.Services {
			for _, tg := range s.All() {
				if n := tg.B.ExpirePassive(now); !n.IsZero() && (next.IsZero() || n.Before(next)) {
					next = n
				}
			}
		}
	}
	return next
}

// runner is the state of Run's loop, touched only by its goroutine.
type runner struct {
	m       *Manager
	ld      *loader           // reads, parses and resolves off the loop
	w       *fsnotify.Watcher // nil when watching is unavailable
	watched map[string]bool   // directories added to w
	cfg     conf.Reload       // of the running configuration
}

func (r *runner) resetResolve(t *time.Ticker) {
	if r.cfg.ResolveInterval > 0 {
		t.Reset(r.cfg.ResolveInterval)
	} else {
		t.Stop()
	}
}

func (r *runner) resetRecheck(t *time.Ticker) {
	if r.cfg.Recheck > 0 {
		t.Reset(r.cfg.Recheck)
	} else {
		t.Stop()
	}
}

// check asks the loader to read the file and reload it if its content
// changed (or if force). It never waits: the result comes back to Run's
// loop as a loaded value.
func (r *runner) check(force bool) { r.ld.request(loadReq{file: true, force: force, dns: force}) }

// applyLoaded applies what the loader read, on Run's loop: binding and
// swapping take milliseconds; reading, parsing and resolving were done off
// the loop.
func (r *runner) applyLoaded(res loaded) {
	m := r.m
	defer r.rewatch() // a symlink may now lead elsewhere
	if res.cfg == nil && res.err == nil {
		return // unchanged
	}
	m.notify(systemd.Reloading())
	err := res.err
	if err == nil {
		err = m.apply(res.cfg, res.dns, res.trigger)
	}
	if err != nil {
		r.refuse(err)
	} else {
		r.cfg = res.cfg.Reload
	}
	m.notify(systemd.Ready + "\n" + systemd.Status(m.StatusLine()))
}

// refuse records and logs a reload that was not applied, on one line.
func (r *runner) refuse(err error) {
	m := r.m
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	m.statusMu.Lock()
	m.status.Failed++
	m.status.LastError, m.status.LastAttempt = msg, time.Now()
	gen := m.status.Generation
	m.statusMu.Unlock()
	m.log.Error().Uint64("generation", gen).Msgf("reload refused, generation %d keeps serving: %s", gen, msg)
}

// rewatch keeps the watch set to the file's directory and, when the path is
// a symlink, the directory it resolves to.
func (r *runner) rewatch() {
	if r.w == nil {
		return
	}
	want := map[string]bool{filepath.Dir(r.m.path): true}
	if real, err := filepath.EvalSymlinks(r.m.path); err == nil {
		want[filepath.Dir(real)] = true
	}
	for d := range r.watched {
		if !want[d] {
			r.w.Remove(d) // may already be gone with its directory
			delete(r.watched, d)
		}
	}
	for d := range want {
		if r.watched[d] {
			continue
		}
		if err := r.w.Add(d); err != nil {
			r.m.log.Warn().Err(err).Str("dir", d).Msg("cannot watch directory; relying on SIGHUP and recheck")
			continue
		}
		r.watched[d] = true
	}
}
