package reload

// The operators' overrides (`fulcrum set`), and what the state file keeps
// of the running configuration (package statefile writes it).

import (
	"errors"
	"fmt"
	"time"

	"fulcrum/backend"
	"fulcrum/statefile"
)

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
	m.opt.State.Changed()
	return true, nil
}

// savedState collects what the state file keeps from the running table and
// the instance; false before the first configuration is applied (a failed
// start keeps the file as it is).
func (m *Manager) savedState() (statefile.State, bool) {
	t := m.Table()
	if t == nil {
		return statefile.State{}, false
	}
	var st statefile.State
	if m.opt.Instance != nil {
		if by, since, ok := m.opt.Instance(); ok {
			st.Instance = &statefile.Drain{By: by, Since: since}
		}
	}
	m.mu.Lock()
	for _, s := range t.Services {
		if w, ok := m.writers[s.Name]; ok && w.name != "" {
			st.Writers = append(st.Writers, statefile.Writer{Service: s.Name, Backend: w.name, Since: w.since.UTC()})
		}
	}
	m.mu.Unlock()
	for _, s := range t.Services {
		for _, tg := range s.All() {
			sb := statefile.Backend{Service: s.Name, Backend: tg.B.Name}
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
	return st, true
}
