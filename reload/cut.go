package reload

import (
	"fulcrum/backend"
	"fulcrum/sched"
)

// cut applies on_down and on_up after backend b changed to state st: a
// backend with on_down = "close" that is no longer up has its sessions
// ended at once (HAProxy's on-marked-down shutdown-sessions), and a primary
// backend with on_up = "close-backups" that came up ends the sessions on
// its service's backups (on-marked-up shutdown-backup-sessions), so that
// clients reconnect to it. Each cut is counted on the backend and logged
// with its reason. Called from Run's loop after the table was rebuilt.
func (m *Manager) cut(b *backend.Backend, st backend.State) {
	t := m.ptr.Load()
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
	if st != backend.StateUp && tg.CutOnDown {
		if n := b.Cut(); n > 0 {
			m.log.Warn().Str("service", b.Service).Str("backend", b.Name).Int("sessions", n).
				Str("reason", "backend "+st.String()).Msg("sessions cut (on_down = close)")
		}
		return
	}
	if st == backend.StateUp && !backup && tg.CutBackupsOnUp {
		for i := range svc.Backups {
			bb := svc.Backups[i].B
			if n := bb.Cut(); n > 0 {
				m.log.Warn().Str("service", b.Service).Str("backend", bb.Name).Int("sessions", n).
					Str("reason", "primary backend "+b.Name+" came up").Msg("sessions cut (on_up = close-backups)")
			}
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

// awaitRoles keeps each backend whose check wants a role, and whose role no
// check has seen yet, out of rotation until its first check (see
// backend.AwaitRole): a writer service must not guess. Part of a commit.
func awaitRoles(jobs []checkJob) {
	for _, j := range jobs {
		if r := j.spec.Probe.Role; r == backend.RolePrimary || r == backend.RoleReplica {
			j.b.AwaitRole()
		}
	}
}
