package health

// Session cuts: the one place that decides when a backend's established
// sessions are ended by fulcrum rather than by their client or server.
//
//   - on_role_change = "close" (the default): the backend's checks saw it
//     answer in another role than before (promoted, demoted). Cut first, so
//     that its sessions end as "role change" even where on_down also
//     applies. Only the sessions dialled before the check saw the change
//     (backend.CutRole): a connection held through a failover dials the
//     promoted node at its passing check, before this cut runs.
//   - on_down = "close": it went down or into the wrong role.
//   - on_up = "close-backups": a primary backend came up; its service's
//     backups are cut.
//   - a split brain (CutSplitBrain, called by reload as the table that
//     shows it is swapped in): every claimant but the one writer kept.
//   - failback: the writer a first service no longer keeps, if still up
//     and its on_down is "close" (CutWriter, called by reload likewise).
//
// Each cut is counted on the backend (CutClosed), logged with its reason,
// and every session cut ends with one of backend's Cut* reasons as its
// access line's end.

import (
	"slices"

	"fulcrum/backend"
	"fulcrum/sched"
)

// cut applies on_role_change, on_down and on_up after backend b changed to
// state st (or changed role).
func (c *Controller) cut(b *backend.Backend, st backend.State) {
	from, to, moved := b.TakeRoleChange() // taken even when nothing is cut: a change is news once
	t := c.table()
	if t == nil {
		return
	}
	svc := t.Service(b.Service)
	if svc == nil {
		return
	}
	tg, backup := findTarget(svc, b)
	if tg == nil {
		return
	}
	if moved && tg.CutOnRole {
		if n := b.CutRole(backend.CutRoleChange); n > 0 { // not those dialled in its new role
			c.log.Warn().Str("service", b.Service).Str("backend", b.Name).Int("sessions", n).
				Str("reason", "answers as "+to+", was "+from).Msg("sessions cut (on_role_change = close)")
		}
	}
	if st != backend.StateUp && tg.CutOnDown {
		if n := b.Cut(backend.CutDown); n > 0 {
			c.log.Warn().Str("service", b.Service).Str("backend", b.Name).Int("sessions", n).
				Str("reason", "backend "+st.String()).Msg("sessions cut (on_down = close)")
		}
		return
	}
	if st == backend.StateUp && !backup && tg.CutBackupsOnUp {
		for i := range svc.Backups {
			bb := svc.Backups[i].B
			if n := bb.Cut(backend.CutBackup); n > 0 {
				c.log.Warn().Str("service", b.Service).Str("backend", bb.Name).Int("sessions", n).
					Str("reason", "primary backend "+b.Name+" came up").Msg("sessions cut (on_up = close-backups)")
			}
		}
	}
}

// CutSplitBrain ends the established sessions of every claimant of svc's
// split brain (sched.Service.SplitBrain) except the writer kept
// (SplitWriter; with none, every claimant's), whatever on_down says: a
// session left on a claimant writes where a failover manager may rewind or
// resync it away. reload calls it right after swapping in a table whose
// split brain began or whose claimants or writer changed, so that nothing
// reaches a claimant that is not the writer; new connections are kept off
// them by the table itself (weight 0, or refusal).
//
// A caller building on this (a check that names the leader, such as
// Patroni's or Sentinel's view) needs nothing more: a node the check
// reports as primary is a claimant, one it reports otherwise is wrong
// role (cut by on_role_change or on_down).
func (c *Controller) CutSplitBrain(svc *sched.Service) {
	for _, tg := range svc.All() {
		name := tg.B.Name
		if name == svc.SplitWriter || !slices.Contains(svc.SplitBrain, name) {
			continue
		}
		if n := tg.B.Cut(backend.CutSplitBrain); n > 0 {
			reason := "claims the primary role with others; none is kept"
			if svc.SplitWriter != "" {
				reason = "claims the primary role; " + svc.SplitWriter + " is kept as the writer"
			}
			c.log.Error().Str("service", svc.Name).Str("backend", name).Int("sessions", n).
				Str("reason", reason).Msg("sessions cut (split brain)")
		}
	}
}

// CutWriter ends the established sessions of old, the writer that a
// failback service (scheduler = "first" with failback) no longer keeps,
// if its on_down is "close" and it is still up: a writer that went down
// is on_down's, and a drained or held one keeps its sessions as drain
// means. Sessions left on a node that is no longer the writer would write
// beside the new one (Galera's certification conflicts, a multi-writer
// MySQL's divergence). reload calls it right after swapping in the table
// with the new writer.
func (c *Controller) CutWriter(svc *sched.Service, old string) {
	for i := range svc.Targets {
		tg := &svc.Targets[i]
		if tg.B.Name != old || !tg.CutOnDown || !tg.Up() {
			continue
		}
		if n := tg.B.Cut(backend.CutWriter); n > 0 {
			c.log.Warn().Str("service", svc.Name).Str("backend", old).Int("sessions", n).
				Str("reason", svc.Writer+" is the writer now").Msg("sessions cut (writer moved, on_down = close)")
		}
	}
}

// findTarget finds b among a service's targets, and whether it is a backup.
func findTarget(s *sched.Service, b *backend.Backend) (*sched.Target, bool) {
	for i := range s.Targets {
		if s.Targets[i].B == b {
			return &s.Targets[i], false
		}
	}
	for i := range s.Backups {
		if s.Backups[i].B == b {
			return &s.Backups[i], true
		}
	}
	return nil, false
}
