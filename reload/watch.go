package reload

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
// A file written in place is read when its writer closes it
// (IN_CLOSE_WRITE), never mid-write; a rename, creation or deletion is
// acted on at once. Events about other files in the directory are ignored:
// they neither trigger nor delay a reload. When the directory itself goes,
// its nearest existing parent is watched until it is back (with a warning
// meanwhile). Events are debounced ([reload] debounce of quiet), and a file
// whose content is what was last tried is not reloaded again. inotify can
// drop events (its queue overflows), so then, and every [reload] recheck,
// the file is re-read. A Hup receive reloads at once, whatever the content.
func (m *Manager) Run(ctx context.Context, cfg *conf.Config) error {
	r := &runner{m: m, cfg: cfg.Reload, watched: map[string]dirID{}}
	r.ld = newLoader(m, cfg.Digest)
	if m.opt.Watchdog > 0 {
		m.srv.SetHeartbeat(m.opt.Watchdog / 2) // before the first accept loop starts
	}
	// Watch before applying, so that no edit made from here on is missed.
	var events <-chan event
	var werrs <-chan error
	mk := newWatcher
	if m.opt.newWatcher != nil {
		mk = m.opt.newWatcher
	}
	w, err := mk()
	if err != nil {
		m.log.Warn().Err(err).Msg("cannot watch the configuration file; reload it with SIGHUP")
	} else {
		defer w.Close()
		r.w, events, werrs = w, w.Events, w.Errors
		r.rewatch()
	}
	sctx, stopSaver := context.WithCancel(context.Background())
	saverDone := make(chan struct{})
	go func() { m.opt.State.Run(sctx, m.savedState); close(saverDone) }() // exits when stopSaver is called, as Run returns, after its last write
	defer func() { stopSaver(); <-saverDone }()                           // after Shutdown: the state at exit is written
	if err := m.Apply(cfg); err != nil {
		m.srv.Close()
		return err
	}
	defer m.Shutdown(context.Background())
	// An edit made since main read the file, read here before the loader
	// starts (so the loader's state stays its own) and before READY=1, as
	// at any start: nothing is being served from the loop yet.
	r.rewatch()
	r.applyLoaded(r.ld.load(ctx, loadReq{file: true}))
	m.notify(systemd.Ready + "\n" + systemd.Status(m.StatusLine()))
	close(m.ready)
	lctx, stopLoader := context.WithCancel(ctx)
	go r.ld.run(lctx) // exits when stopLoader is called, as Run returns
	defer func() { stopLoader(); <-r.ld.done }()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	recheck := time.NewTicker(time.Hour)
	defer recheck.Stop()
	r.resetRecheck(recheck)
	resolveTick := time.NewTicker(time.Hour)
	defer resolveTick.Stop()
	r.resetResolve(resolveTick)
	// Health runs beside this loop: transitions rebuild the table through
	// refresh, which takes m.mu like a reload.
	hctx, stopHealth := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() { m.health.Run(hctx); close(healthDone) }() // exits when stopHealth is called, as Run returns
	defer func() { stopHealth(); <-healthDone }()
	onEvent := func(ev event) {
		switch r.classify(ev) {
		case evFile, evDirs:
			debounce.Reset(r.cfg.Debounce)
		case evWriting:
			debounce.Stop() // read when the writer closes the file
		}
	}
	onErr := func(err error) {
		m.log.Warn().Err(err).Msg("file watcher error; re-reading the configuration")
		r.writing = false // its close may be among the lost events
		r.rewatch()       // so may a directory's removal
		debounce.Reset(r.cfg.Debounce)
	}
	var watchdog <-chan time.Time
	if m.opt.Watchdog > 0 {
		t := time.NewTicker(m.opt.Watchdog)
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
			onEvent(ev)
		case err, ok := <-werrs:
			if !ok {
				werrs = nil
				continue
			}
			onErr(err)
		case <-debounce.C:
			r.check(false)
			r.resetRecheck(recheck)
		case <-recheck.C:
			if !r.writing { // a writer at work: its close brings the read
				r.rewatch()
				r.ld.request(loadReq{file: true, recheck: true})
			}
		case <-resolveTick.C:
			r.ld.request(loadReq{dns: true})
		case res := <-r.ld.out:
			if r.w != nil { // every event the kernel has first: a writer may have begun since the read was asked for
				r.w.Sync(onEvent, onErr)
			}
			r.applyLoaded(res)
			r.resetResolve(resolveTick)
		case <-m.opt.Hup:
			debounce.Stop()
			r.check(true)
			r.resetRecheck(recheck)
		case <-watchdog:
			// This loop is running; the accept loops must have answered
			// their heartbeat (every half interval) within two intervals,
			// or systemd hears nothing.
			alive := m.srv.Alive
			if m.opt.Alive != nil {
				alive = m.opt.Alive
			}
			if alive(2 * m.opt.Watchdog) {
				m.notify(systemd.Watchdog + "\n" + systemd.Status(m.StatusLine()))
			} else {
				m.log.Error().Msg("an accept loop did not answer; withholding the watchdog ping")
			}
		}
	}
}

// runner is the state of Run's loop, touched only by its goroutine.
type runner struct {
	m       *Manager
	ld      *loader          // reads, parses and resolves off the loop
	w       *watcher         // nil when watching is unavailable
	watched map[string]dirID // directories added to w, with the identity they had then
	real    string           // the path with symlinks resolved at the last rewatch; "" if it did not resolve
	missing string           // a wanted directory that is gone, watched through its parent; "" if none
	writing bool             // the file was written and not yet closed by its writer
	again   bool             // a read was dropped for being taken mid-write: the next must apply even if unchanged
	cfg     conf.Reload      // of the running configuration
}

// dirID identifies a directory across deletion and recreation at the same
// path.
type dirID struct{ dev, ino uint64 }

func statID(dir string) (dirID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return dirID{}, false
	}
	return dirID{uint64(st.Dev), st.Ino}, true
}

// What an event means for the configuration file.
const (
	evIgnore  = iota // about another file: neither triggers nor delays a reload
	evFile           // the file was replaced, closed after writing, created or deleted: read it
	evWriting        // the file is being written in place: wait for its writer to close it
	evDirs           // a watched directory, or one on the way to it, came or went: watch again, then read
)

// classify tells what ev means, and tracks whether a writer is at work.
func (r *runner) classify(ev event) int {
	path := filepath.Clean(r.m.path) // as event names are spelled
	if _, ok := r.watched[ev.Name]; ok && ev.has(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) {
		r.rewatch()
		return evDirs
	}
	if ev.Name == path || ev.Name == r.real {
		switch {
		case ev.has(unix.IN_CLOSE_WRITE):
			r.writing = false
			return evFile
		case ev.has(unix.IN_MODIFY):
			r.writing = true
			return evWriting
		default: // created, deleted, moved in or out
			r.writing = false
			return evFile
		}
	}
	if r.missing != "" && ev.has(unix.IN_CREATE|unix.IN_MOVED_TO) &&
		(r.missing == ev.Name || strings.HasPrefix(r.missing, ev.Name+string(filepath.Separator))) {
		r.rewatch() // the directory, or one on the way to it, is back
		return evDirs
	}
	// Through a symlink (a Kubernetes ConfigMap swaps "..data"), another
	// name in the directory can change what the path leads to.
	if r.real != path && ev.has(unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE) {
		if real, _ := filepath.EvalSymlinks(path); real != r.real {
			return evFile
		}
	}
	return evIgnore
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
func (r *runner) check(force bool) {
	r.rewatch() // before the read: a directory may be back
	r.ld.request(loadReq{file: true, force: force, dns: force, again: r.again})
	r.again = false
}

// applyLoaded applies what the loader read, on Run's loop: binding and
// swapping take milliseconds; reading, parsing and resolving were done off
// the loop.
func (r *runner) applyLoaded(res loaded) {
	m := r.m
	defer r.rewatch() // a symlink may now lead elsewhere
	if res.cfg == nil && res.err == nil {
		return // unchanged
	}
	if r.writing && res.trigger != "dns" {
		// Read while a writer had the file open: maybe half of it. Its close
		// brings the next read, which must apply even if the content is
		// what was read now (the writer may have been done but for closing).
		r.again = true
		return
	}
	m.notify(systemd.Reloading())
	err := res.err
	if err == nil {
		err = m.apply(res.cfg, res.dns, res.trigger)
	}
	if err != nil {
		r.refuse(err, res.trigger)
	} else {
		r.cfg = res.cfg.Reload
	}
	m.notify(systemd.Ready + "\n" + systemd.Status(m.StatusLine()))
}

// refuse records and logs a reload that was not applied, on one line whose
// errors field holds each problem as its own entry.
func (r *runner) refuse(err error, trigger string) {
	m := r.m
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	m.statusMu.Lock()
	m.status.Failed++
	m.status.LastError, m.status.LastAttempt = msg, time.Now()
	gen := m.status.Generation
	m.statusMu.Unlock()
	var list []string
	for _, e := range flatten(err) {
		list = append(list, strings.ReplaceAll(e.Error(), "\n", "; "))
	}
	e := m.log.Error().Uint64("generation", gen).Strs("errors", list)
	if trigger != "" {
		e = e.Str("trigger", trigger)
	}
	e.Msgf("reload refused, generation %d keeps serving: %d problems", gen, len(list))
	first := ""
	if len(list) > 0 {
		first = list[0]
	}
	m.pool.Events.Add(backend.Event{At: time.Now(), From: fmt.Sprintf("generation %d", gen), To: "reload refused", Reason: first})
}

// flatten lists the errors joined in err (errors.Join, as conf returns
// every problem), or err alone.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// rewatch keeps the watch set to the file's directory and, when the path is
// a symlink, the directory it resolves to. A directory that is gone (or was
// replaced by another at the same path) is dropped, and its nearest
// existing parent watched until it is back.
func (r *runner) rewatch() {
	path := r.m.path
	prev := r.real
	r.real = ""
	if real, err := filepath.EvalSymlinks(path); err == nil {
		r.real = real
	}
	if prev != "" && r.real != "" && r.real != prev {
		// The path leads elsewhere now. The events that said so may come
		// after this (a ConfigMap's "..data" swapped just as a reload
		// finished) and would then look like nothing changed: read it now.
		r.ld.request(loadReq{file: true})
	}
	if r.w == nil {
		return
	}
	want := map[string]bool{filepath.Dir(path): true}
	if r.real != "" {
		want[filepath.Dir(r.real)] = true
	}
	missing := ""
	for d := range want {
		if _, ok := statID(d); ok {
			continue
		}
		delete(want, d)
		if missing == "" {
			missing = d
		}
		for p := filepath.Dir(d); ; p = filepath.Dir(p) { // the nearest parent that exists
			if _, ok := statID(p); ok || p == filepath.Dir(p) {
				want[p] = true
				break
			}
		}
	}
	for d, id := range r.watched {
		if now, ok := statID(d); !want[d] || !ok || now != id {
			r.w.Remove(d)
			delete(r.watched, d)
		}
	}
	for d := range want {
		if _, ok := r.watched[d]; ok {
			continue
		}
		id, _ := statID(d)
		if err := r.w.Add(d); err != nil {
			r.m.log.Warn().Err(err).Str("dir", d).Msg("cannot watch directory; relying on SIGHUP and recheck")
			continue
		}
		r.watched[d] = id
	}
	switch {
	case missing != "" && r.missing == "":
		r.m.log.Warn().Str("dir", missing).Msg("configuration directory is gone; watching its parent until it is back")
	case missing == "" && r.missing != "":
		r.m.log.Info().Str("dir", r.missing).Msg("configuration directory is back; watching it again")
	}
	r.missing = missing
}
