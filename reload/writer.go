package reload

import (
	"slices"
	"strings"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/sched"
)

// singleWriter applies split_brain to a service whose checks want a
// primary: when more than one of its backends is up and answered as
// primary, it must never spread writes across them. With "refuse" every
// target gets weight 0 (nothing is eligible, and admission refuses with
// reason split-brain); with "first" only the first claimant in file order
// keeps its weight. It returns the claimants (nil when at most one). It
// changes only the targets' weights in the slices it is given, which the
// caller builds the pickers from.
func singleWriter(cs conf.Service, prim, back []sched.Target) (claimants []string) {
	wantsPrimary := map[string]bool{}
	for _, b := range cs.Backends {
		if b.Health.Role == backend.RolePrimary {
			wantsPrimary[b.Name] = true
		}
	}
	if len(wantsPrimary) < 2 {
		return nil
	}
	// File order: conf lists backends, primaries and backups mixed.
	order := map[string]int{}
	for i, b := range cs.Backends {
		order[b.Name] = i
	}
	var claim []*sched.Target
	for _, ts := range [][]sched.Target{prim, back} {
		for i := range ts {
			t := &ts[i]
			if st, role := t.B.State(); wantsPrimary[t.B.Name] && st == backend.StateUp && role == backend.RolePrimary && !t.B.Draining() {
				claim = append(claim, t)
			}
		}
	}
	if len(claim) < 2 {
		return nil
	}
	slices.SortFunc(claim, func(a, b *sched.Target) int { return order[a.B.Name] - order[b.B.Name] })
	for _, t := range claim {
		claimants = append(claimants, t.B.Name)
	}
	if cs.SplitBrain == "first" {
		for _, t := range claim[1:] {
			t.Weight = 0
		}
		return claimants
	}
	for _, ts := range [][]sched.Target{prim, back} {
		for i := range ts {
			ts[i].Weight = 0
		}
	}
	return claimants
}

// swapped runs after each swap of the table (reload or health rebuild):
// it wakes the connections held for an eligible backend (hold_timeout) to
// look at the new table, and logs each service's split brain once as it
// starts and once as it ends, and counts it.
func (m *Manager) swapped(old *sched.Table, next *listener.Snapshot) {
	for _, s := range next.Services {
		s.Group.Kick()
	}
	for _, s := range next.Services {
		var was []string
		if old != nil {
			if os := old.Service(s.Name); os != nil {
				was = os.SplitBrain
			}
		}
		switch {
		case len(s.SplitBrain) > 0 && len(was) == 0:
			s.Group.SplitBrainBegan()
			action := "keeping only the first (split_brain = first)"
			if next.Policy(s).RefuseSplitBrain {
				action = "refusing new connections (split_brain = refuse)"
			}
			m.log.Error().Str("service", s.Name).Str("backends", strings.Join(s.SplitBrain, ", ")).
				Msg("split brain: more than one backend claims the primary role; " + action)
		case len(s.SplitBrain) == 0 && len(was) > 0:
			m.log.Warn().Str("service", s.Name).Str("backends_were", strings.Join(was, ", ")).
				Msg("split brain over: at most one backend claims the primary role")
		case len(s.SplitBrain) > 0 && !slices.Equal(s.SplitBrain, was):
			m.log.Error().Str("service", s.Name).Str("backends", strings.Join(s.SplitBrain, ", ")).Msg("split brain: the claimants changed")
		}
	}
}
