package reload

import (
	"errors"
	"fmt"
	"time"

	"fulcrum/conf"
	"fulcrum/sched"
)

// failback = "never" | "after:DURATION" | "manual" makes scheduler =
// "first" keep one writer: the backend that takes new connections stays
// the writer until it fails (is not up: down, wrong role, drained, held,
// weight 0), or until the preferred backend (the first up in file order)
// has been up for the DURATION, or until an operator promotes one
// (Promote, `fulcrum set S/B writer`). The writer is the Manager's state
// (writers), decided at each build from the live health, carried into the
// table (sched.Service.Writer and its picker's Options.Writer, so a pick
// reads it with the table's one atomic load), kept in the state file and
// restored at start.

// writerState is a failback service's writer and since when it has been.
type writerState struct {
	name  string
	since time.Time
}

// chooseWriter decides a failback service's writer from the current one
// (cur) and the primary targets' live state at now. floor is when this
// process began to know the backends' health (its first apply): a backend
// up since before it counts from it, so that a restart does not look like
// DURATION passed. It returns the writer, why it moved ("" if it did not),
// and when an after: failback becomes due (zero: none pending).
func chooseWriter(cs *conf.Service, prim []sched.Target, cur writerState, floor, now time.Time) (next writerState, why string, due time.Time) {
	var w, p *sched.Target
	for i := range prim {
		t := &prim[i]
		if !t.Up() {
			continue
		}
		if p == nil {
			p = t
		}
		if t.B.Name == cur.name {
			w = t
		}
	}
	switch {
	case p == nil: // nothing is up: remember the last writer, nothing is picked anyway
		return cur, "", time.Time{}
	case w == nil && cur.name == "":
		return writerState{p.B.Name, now}, "first writer", time.Time{}
	case w == nil:
		return writerState{p.B.Name, now}, "writer " + cur.name + " is not up", time.Time{}
	case w == p || cs.Failback != conf.FailbackAfter:
		return cur, "", time.Time{}
	}
	_, _, upSince := p.B.Health()
	start := floor
	for _, t := range []time.Time{upSince, cur.since} {
		if t.After(start) {
			start = t
		}
	}
	if at := start.Add(cs.FailbackAfter); now.Before(at) {
		return cur, "", at
	}
	return writerState{p.B.Name, now}, fmt.Sprintf("failback: %s up for %s", p.B.Name, cs.FailbackAfter), time.Time{}
}

// writerMove is a writer change that build decided, for the commit to log
// and act on.
type writerMove struct {
	service, from, to, why string
}

// planWriter applies failback to service cs being built into p: it decides
// the writer and sets it on svc (Writer, and Options.Writer for the
// picker). Called by build with m.mu held; it changes no live state.
func (m *Manager) planWriter(p *plan, cs *conf.Service, svc *sched.Service, prim []sched.Target, now time.Time) {
	if cs.Failback == conf.FailbackNone {
		return
	}
	floor := m.started
	if floor.IsZero() {
		floor = now
	}
	was := m.writers[cs.Name]
	cur := was
	pr, promoted := m.promote[cs.Name]
	if promoted {
		cur = pr.writerState
	}
	next, why, due := chooseWriter(cs, prim, cur, floor, now)
	if promoted && next.name == pr.name && next.name != was.name {
		why = "promoted by " + pr.by
	}
	svc.Writer, svc.Options.Writer = next.name, next.name
	if p.writers == nil {
		p.writers = map[string]writerState{}
	}
	p.writers[cs.Name] = next
	if next.name != was.name && why != "" {
		p.moves = append(p.moves, writerMove{cs.Name, was.name, next.name, why})
	}
	if !due.IsZero() && (p.failbackDue.IsZero() || due.Before(p.failbackDue)) {
		p.failbackDue = due
	}
}

// commitWriters makes p's writers the Manager's, after p's table is
// swapped in: it logs each move, ends the sessions of a writer that
// moved while still up when its on_down is "close", and sets the timer of
// the next after: failback. Called with m.mu held.
func (m *Manager) commitWriters(p *plan) {
	if m.started.IsZero() {
		m.started = time.Now()
	}
	changed := false
	for _, mv := range p.moves {
		changed = true
		e := m.log.Info()
		if mv.from != "" {
			e = m.log.Warn()
		}
		e.Str("service", mv.service).Str("writer", mv.to).Str("was", mv.from).Str("reason", mv.why).Msg("writer moved")
		if svc := p.table.Service(mv.service); svc != nil && mv.from != "" {
			m.health.CutWriter(svc, mv.from)
		}
	}
	if len(p.writers) != len(m.writers) {
		changed = true
	}
	m.writers = p.writers
	m.promote = nil // applied, or overtaken by the backend's health
	if m.failback != nil {
		m.failback.Stop()
		m.failback = nil
	}
	if !p.failbackDue.IsZero() && !m.stopped {
		m.failback = time.AfterFunc(time.Until(p.failbackDue)+time.Millisecond, m.refresh) // refresh takes m.mu; after Shutdown it does nothing
	}
	if changed {
		m.opt.State.Changed()
	}
}

// Promote makes backend name the writer of a service with failback
// (`fulcrum set SERVICE/BACKEND writer`): it takes new connections from
// now on, as if it had always been the writer; the old writer's sessions
// are ended if its on_down is "close". The backend must be up. It reports
// whether the writer changed.
func (m *Manager) Promote(service, name, by string) (bool, error) {
	m.mu.Lock()
	t := m.Table()
	if t == nil || m.cur == nil {
		m.mu.Unlock()
		return false, errors.New("no configuration applied yet")
	}
	s := t.Service(service)
	var cs *conf.Service
	for i := range m.cur.Services {
		if m.cur.Services[i].Name == service {
			cs = &m.cur.Services[i]
		}
	}
	if s == nil || cs == nil {
		m.mu.Unlock()
		return false, fmt.Errorf("no service %q in the running configuration", service)
	}
	if cs.Failback == conf.FailbackNone {
		m.mu.Unlock()
		return false, fmt.Errorf(`service %s has no failback: its writer is always the first backend up (set failback = "manual", "never" or "after:DURATION")`, service)
	}
	var tg *sched.Target
	for i := range s.Targets {
		if s.Targets[i].B.Name == name {
			tg = &s.Targets[i]
		}
	}
	if tg == nil {
		m.mu.Unlock()
		return false, fmt.Errorf("no backend %q among the primary backends of service %s", name, service)
	}
	if c := s.Condition(tg); !tg.Up() {
		m.mu.Unlock()
		return false, fmt.Errorf("%s/%s is not up (%s: %s): a writer must take connections", service, name, c.State, c.Reason)
	}
	if m.writers[service].name == name {
		m.mu.Unlock()
		return false, nil
	}
	if m.promote == nil {
		m.promote = map[string]promotion{}
	}
	m.promote[service] = promotion{writerState{name, time.Now()}, by}
	m.mu.Unlock()
	m.refresh()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writers[service].name != name {
		// Not taken by this build (it stopped early, or the backend went
		// down): the request ends here, not at some later build.
		if p, ok := m.promote[service]; ok && p.name == name {
			delete(m.promote, service)
		}
		return false, fmt.Errorf("%s/%s did not become the writer: it is not up any more, or no table was built", service, name)
	}
	return true, nil
}

// promotion is an operator's Promote waiting for the next build.
type promotion struct {
	writerState
	by string
}
