package reload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"fulcrum/backend"
)

// SavedState is what [admin] state_file keeps across restarts: the
// instance's drain, the operators' per-backend overrides (`fulcrum set`),
// each backend's last known health and each failback service's writer. It is written whole, atomically
// (a temporary file renamed over the old one), whenever one of them
// changes, and read once at start.
type SavedState struct {
	// Format is the file's header and version, always first: conf refuses
	// a state_file that exists and does not begin with it (or with
	// "saved", as files of earlier releases do; conf.IsStateFile), so that
	// fulcrum never overwrites a file it did not write.
	Format   int            `json:"fulcrum_state"`
	Saved    time.Time      `json:"saved"`
	Instance *SavedDrain    `json:"instance_drain,omitempty"` // absent: the instance was not drained
	Backends []SavedBackend `json:"backends,omitempty"`
	Writers  []SavedWriter  `json:"writers,omitempty"` // failback services' writers; absent in files of earlier releases
}

// SavedWriter is the writer of a service with failback (scheduler =
// "first"), so that a restart keeps new connections where they were.
type SavedWriter struct {
	Service string    `json:"service"`
	Backend string    `json:"backend"`
	Since   time.Time `json:"since,omitzero"` // when it became the writer
}

// SavedDrain is the instance's drain: who asked and when.
type SavedDrain struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
}

// SavedBackend is one backend's state worth keeping: an override other than
// ready, or being down.
type SavedBackend struct {
	Service  string    `json:"service"`
	Backend  string    `json:"backend"`
	Override string    `json:"override,omitempty"` // drain | maint; absent: ready
	By       string    `json:"by,omitempty"`       // who set the override
	Down     bool      `json:"down,omitempty"`     // down or in the wrong role when saved
	Reason   string    `json:"reason,omitempty"`   // why it was down
	Since    time.Time `json:"since,omitzero"`
}

// stateFormat is SavedState.Format as this release writes it.
const stateFormat = 1

// ErrDamaged is returned by ReadState for a state file that exists but
// cannot be read as one: cut short, edited by hand, or unreadable.
var ErrDamaged = errors.New("state file damaged")

// ReadState reads a state file; a file that does not exist yet, or is
// empty, is an empty state, not an error. Any other file that does not hold
// a whole state is ErrDamaged.
func ReadState(path string) (SavedState, error) {
	var st SavedState
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
		return SavedState{}, fmt.Errorf("%w: %s: %w", ErrDamaged, path, err)
	}
	if st.Format > stateFormat {
		return SavedState{}, fmt.Errorf("%w: %s: format %d, from a newer fulcrum (this one reads %d)", ErrDamaged, path, st.Format, stateFormat)
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

// Restore hands the state read at start to the Manager, before Run or the
// first Apply: each failback service's writer stays the writer if it is
// up, and the first configuration applied puts each named backend that
// it still has back in its override, and a backend that was down stays down
// until its active checks pass rise times (one without active checks comes
// up at once, as it would at any start). Backends the file no longer names
// are ignored.
func (m *Manager) Restore(st SavedState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restore = map[[2]string]SavedBackend{}
	for _, b := range st.Backends {
		m.restore[[2]string{b.Service, b.Backend}] = b
	}
	m.writers = map[string]writerState{}
	for _, w := range st.Writers {
		m.writers[w.Service] = writerState{w.Backend, w.Since} // the first build keeps it if it is up (failback.go)
	}
}

// restoreOnce applies Restore's state to the first table, before it is
// swapped in. Called with m.mu held.
func (m *Manager) restoreOnce(p *plan) {
	if m.restore == nil {
		return
	}
	for _, s := range p.table.Services {
		for _, t := range s.All() {
			sb, ok := m.restore[[2]string{s.Name, t.B.Name}]
			if !ok {
				continue
			}
			if o, ok := backend.ParseOverride(sb.Override); ok && o != backend.Ready {
				t.B.SetOverride(o, sb.By, sb.Since)
				m.ovlog.Warn().Str("service", s.Name).Str("backend", t.B.Name).Str("state", o.String()).Str("by", sb.By).
					Msg("override restored from the state file")
			}
			if sb.Down {
				t.B.StartDown("down before the restart (" + sb.Reason + "); up after its checks pass")
				m.ovlog.Info().Str("service", s.Name).Str("backend", t.B.Name).Str("reason", sb.Reason).
					Msg("backend starts down, as it was before the restart")
			}
		}
	}
	m.restore = nil
}

// SetOverride sets an operator's state on a backend of the running
// configuration (`fulcrum set SERVICE/BACKEND drain|maint|ready`): the file
// stays the truth for weights and membership, the override holds across
// reloads and is cleared by Ready or by the backend's removal. It reports
// whether the state changed.
func (m *Manager) SetOverride(service, name string, o backend.Override, by string) (bool, error) {
	t := m.Table()
	if t == nil {
		return false, errors.New("no configuration applied yet")
	}
	s := t.Service(service)
	if s == nil {
		return false, fmt.Errorf("no service %q in the running configuration", service)
	}
	var b *backend.Backend
	for _, tg := range s.All() {
		if tg.B.Name == name {
			b = tg.B
		}
	}
	if b == nil {
		return false, fmt.Errorf("no backend %q in service %s", name, service)
	}
	was, _, _ := b.Override()
	if !b.SetOverride(o, by, time.Now()) {
		return false, nil
	}
	e := m.ovlog.Warn()
	if o == backend.Ready {
		e = m.ovlog.Info()
	}
	e.Str("service", service).Str("backend", name).Str("state", o.String()).Str("was", was.String()).Str("by", by).Msg("backend override set")
	m.refresh() // effective weights: 0 while held
	m.StateChanged()
	return true, nil
}

// StateChanged says that something the state file keeps may have changed:
// the saver writes it soon, off the caller's path. It never blocks.
func (m *Manager) StateChanged() {
	select {
	case m.dirty <- struct{}{}:
	default: // a write is pending already
	}
}

// HandOver stops writing the state file: a binary upgrade has started a new
// process that owns it now, while this one drains.
func (m *Manager) HandOver() { m.handed.Store(true) }

// saveLoop writes the state file after each StateChanged until ctx ends,
// then once more. Run owns it.
func (m *Manager) saveLoop(ctx context.Context) {
	var last []byte
	for {
		select {
		case <-ctx.Done():
			m.saveState(&last)
			return
		case <-m.dirty:
			m.saveState(&last)
		}
	}
}

// saveState writes the state file if its content changed since *last.
func (m *Manager) saveState(last *[]byte) {
	if m.StateFile == "" || m.Table() == nil || m.handed.Load() {
		return // nothing applied (a failed start), or handed over: keep the file as it is
	}
	st := m.savedState()
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
		err = writeAtomic(m.StateFile, append(data, '\n'))
	}
	if err != nil {
		m.ovlog.Error().Err(err).Str("path", m.StateFile).Msg("cannot write the state file; a restart will forget overrides and health")
		return
	}
	*last = body
}

// savedState collects what the state file keeps from the running table and
// the instance.
func (m *Manager) savedState() SavedState {
	st := SavedState{Format: stateFormat, Saved: time.Now().UTC()}
	if m.Instance != nil {
		if by, since, ok := m.Instance(); ok {
			st.Instance = &SavedDrain{By: by, Since: since}
		}
	}
	t := m.Table()
	if t == nil {
		return st
	}
	m.mu.Lock()
	for _, s := range t.Services {
		if w, ok := m.writers[s.Name]; ok && w.name != "" {
			st.Writers = append(st.Writers, SavedWriter{Service: s.Name, Backend: w.name, Since: w.since.UTC()})
		}
	}
	m.mu.Unlock()
	for _, s := range t.Services {
		for _, tg := range s.All() {
			sb := SavedBackend{Service: s.Name, Backend: tg.B.Name}
			if o, by, since := tg.B.Override(); o != backend.Ready {
				sb.Override, sb.By, sb.Since = o.String(), by, since
			}
			if hs, _ := tg.B.State(); hs != backend.StateUp {
				_, reason, _ := tg.B.Health()
				sb.Down, sb.Reason = true, reason
			}
			if sb.Override != "" || sb.Down {
				st.Backends = append(st.Backends, sb)
			}
		}
	}
	return st
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
