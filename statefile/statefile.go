// Package statefile is [admin] state_file: what a daemon keeps across
// restarts (the instance's drain, the operators' per-backend overrides from
// `fulcrum set`, each backend's last known health and each failback
// service's writer). It is read once at start (Open), put back on the first
// table reload commits (Restore), and written whole, atomically, soon after
// any of it changes (Changed, Run), until a binary upgrade's new process
// takes it over (StopWriting).
//
// Typical use: see Example (main opens it and hands it to reload, which
// calls Restore at each commit (the first only does anything), Changed
// at each commit and change, and runs Run beside its own).
//
// A nil *File is no state file: every method does nothing. Ownership: Run
// is the only writer; it returns when its context ends, after a last write.
package statefile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/sched"
)

// State is what the file keeps. It is written whole, atomically (a
// temporary file renamed over the old one).
type State struct {
	// Format is the file's header and version, always first: conf refuses
	// a state_file that exists and does not begin with it (or with
	// "saved", as files of earlier releases do; conf.IsStateFile), so that
	// fulcrum never overwrites a file it did not write.
	Format   int       `json:"fulcrum_state"`
	Saved    time.Time `json:"saved"`
	Instance *Drain    `json:"instance_drain,omitempty"` // absent: the instance was not drained
	Backends []Backend `json:"backends,omitempty"`
	Writers  []Writer  `json:"writers,omitempty"` // failback services' writers; absent in files of earlier releases
}

// Writer is the writer of a service with failback (scheduler = "first"),
// so that a restart keeps new connections where they were.
type Writer struct {
	Service string    `json:"service"`
	Backend string    `json:"backend"`
	Since   time.Time `json:"since,omitzero"` // when it became the writer
}

// Drain is the instance's drain: who asked and when.
type Drain struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
}

// Backend is one backend's state worth keeping: an override other than
// ready, or being down.
type Backend struct {
	Service  string    `json:"service"`
	Backend  string    `json:"backend"`
	Override string    `json:"override,omitempty"` // drain | maint; absent: ready
	By       string    `json:"by,omitempty"`       // who set the override
	Down     bool      `json:"down,omitempty"`     // down or in the wrong role when saved
	Reason   string    `json:"reason,omitempty"`   // why it was down
	Since    time.Time `json:"since,omitzero"`
}

// Format is State.Format as this release writes it.
const Format = 1

// ErrDamaged is returned by Read for a state file that exists but cannot be
// read as one: cut short, edited by hand, or unreadable.
var ErrDamaged = errors.New("state file damaged")

// Read reads a state file; a file that does not exist yet, or is empty, is
// an empty state, not an error. Any other file that does not hold a whole
// state is ErrDamaged.
func Read(path string) (State, error) {
	var st State
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("%w: %s: %w", ErrDamaged, path, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, fmt.Errorf("%w: %s: %w", ErrDamaged, path, err)
	}
	if st.Format > Format {
		return State{}, fmt.Errorf("%w: %s: format %d, from a newer fulcrum (this one reads %d)", ErrDamaged, path, st.Format, Format)
	}
	return st, nil
}

// SetAside renames a damaged state file out of the way, beside it, so that
// the next save cannot overwrite it, and returns its new name.
func SetAside(path string, now time.Time) (string, error) {
	aside := path + ".damaged-" + now.UTC().Format("20060102T150405Z")
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("keep the damaged state file aside: %w", err)
	}
	return aside, nil
}

// File is a running daemon's state file.
type File struct {
	path    string
	log     zerolog.Logger
	read    State         // what Open read
	dirty   chan struct{} // Changed → Run; buffered 1
	stopped atomic.Bool   // StopWriting was called

	mu       sync.Mutex // protects restored
	restored bool       // Restore has run
}

// ErrRefused is Open's error when the file is damaged and startEmpty is
// false: the daemon must not start (Open has logged why and what to do).
var ErrRefused = errors.New("the state file is damaged")

// Open reads the state file at path, at start. A damaged file refuses the
// start (ErrRefused), since starting without the drains and overrides it
// held would put them back in rotation unnoticed, unless startEmpty
// ([admin] state_damaged = "start-empty"): then it is kept aside and the
// daemon starts with nothing restored. Open logs either case. A path of ""
// is no state file: Open returns nil, nil.
func Open(path string, startEmpty bool, log zerolog.Logger) (*File, error) {
	if path == "" {
		return nil, nil
	}
	f := &File{path: path, log: log.With().Str("component", "state").Logger(), dirty: make(chan struct{}, 1)}
	st, err := Read(path)
	if err != nil {
		if !startEmpty {
			f.log.Error().Err(err).Str("path", path).Msg("cannot start: the state file is damaged; starting without the drains and overrides it held would put them back in rotation unnoticed. Repair or remove it, or set [admin] state_damaged = \"start-empty\" to keep it aside and start without it")
			return nil, ErrRefused
		}
		aside, rerr := SetAside(path, time.Now())
		if rerr != nil {
			f.log.Error().Err(err).AnErr("aside", rerr).Str("path", path).Msg("cannot start: the state file is damaged and cannot be kept aside; the first save would overwrite it")
			return nil, ErrRefused
		}
		f.log.Error().Err(err).Str("path", path).Str("kept_as", aside).Msg("the state file is damaged: kept aside, starting with no drain, override or health from it (state_damaged = \"start-empty\")")
		st = State{}
	}
	f.read = st
	return f, nil
}

// Restored is the state Open read: the instance's drain and the writers for
// the daemon to take back; Restore puts the backends' part on the table.
func (f *File) Restored() State {
	if f == nil {
		return State{}
	}
	return f.read
}

// Restore puts the state read at start on t, the first table reload
// commits, before it is swapped in: each backend t still has goes back into
// its override, and one that was down stays down until its active checks
// pass rise times (one without active checks comes up at once, as at any
// start). Backends the file no longer names are ignored. Only the first
// call does anything.
func (f *File) Restore(t *sched.Table) {
	if f == nil {
		return
	}
	f.mu.Lock()
	first := !f.restored
	f.restored = true
	f.mu.Unlock()
	if !first {
		return
	}
	saved := map[[2]string]Backend{}
	for _, b := range f.read.Backends {
		saved[[2]string{b.Service, b.Backend}] = b
	}
	for _, s := range t.Services {
		for _, tg := range s.All() {
			sb, ok := saved[[2]string{s.Name, tg.B.Name}]
			if !ok {
				continue
			}
			if o, ok := backend.ParseOverride(sb.Override); ok && o != backend.Ready {
				tg.B.SetOverride(o, sb.By, sb.Since)
				f.log.Warn().Str("service", s.Name).Str("backend", tg.B.Name).Str("state", o.String()).Str("by", sb.By).
					Msg("override restored from the state file")
			}
			if sb.Down {
				tg.B.StartDown("down before the restart (" + sb.Reason + "); up after its checks pass")
				f.log.Info().Str("service", s.Name).Str("backend", tg.B.Name).Str("reason", sb.Reason).
					Msg("backend starts down, as it was before the restart")
			}
		}
	}
}

// Changed says that something the file keeps may have changed: Run writes
// it soon, off the caller's path. It never blocks.
func (f *File) Changed() {
	if f == nil {
		return
	}
	select {
	case f.dirty <- struct{}{}:
	default: // a write is pending already
	}
}

// StopWriting stops writing the file for good: a binary upgrade's new
// process owns it now, while this one drains.
func (f *File) StopWriting() {
	if f != nil {
		f.stopped.Store(true)
	}
}

// Run writes the file after each Changed until ctx ends, then once more.
// collect returns what to write, or false while there is nothing to keep
// (no configuration applied: a failed start must not empty the file).
func (f *File) Run(ctx context.Context, collect func() (State, bool)) {
	if f == nil {
		return
	}
	var last []byte
	for {
		select {
		case <-ctx.Done():
			f.save(collect, &last)
			return
		case <-f.dirty:
			f.save(collect, &last)
		}
	}
}

// save writes the file if its content changed since *last (the time of the
// save apart).
func (f *File) save(collect func() (State, bool), last *[]byte) {
	if f.stopped.Load() {
		return // handed over: keep the file as the new process writes it
	}
	st, ok := collect()
	if !ok {
		return
	}
	st.Format, st.Saved = Format, time.Now().UTC()
	body, err := json.Marshal(st.Backends)
	if err == nil {
		var inst []byte
		inst, err = json.Marshal(st.Instance)
		body = append(body, inst...)
	}
	if err == nil {
		var ws []byte
		ws, err = json.Marshal(st.Writers)
		body = append(body, ws...)
	}
	if err != nil || bytes.Equal(body, *last) {
		return
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		err = writeAtomic(f.path, append(data, '\n'))
	}
	if err != nil {
		f.log.Error().Err(err).Str("path", f.path).Msg("cannot write the state file; a restart will forget overrides and health")
		return
	}
	*last = body
}

// writeAtomic writes data to path through a temporary file in the same
// directory, synced and renamed over path, so that a crash leaves the old
// file or the new one, never a part.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
