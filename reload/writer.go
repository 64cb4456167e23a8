package reload

import (
	"slices"
	"strings"
	"time"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/sched"
)

// singleWriter applies split_brain to a service whose checks want a
// primary: when more than one of its backends is up and last answered as
// primary, it must never spread writes across them. With "first" only the
// first claimant in file order keeps its weight; with "newest" only the
// claimant on the highest PostgreSQL timeline (a promotion raises it, so
// that is the node promoted last; a tie, or a timeline not known, is no
// answer); otherwise ("refuse", or "newest" without an answer) every
// target gets weight 0 (nothing is eligible, and admission refuses with
// reason split-brain). It returns the claimants in file order (nil when at
// most one) and the writer kept ("" when it refuses). It changes only the
// targets' weights in the slices it is given, which the caller builds the
// pickers from.
func singleWriter(cs conf.Service, prim, back []sched.Target) (claimants []string, writer string) {
	wantsPrimary := map[string]bool{}
	for _, b := range cs.Backends {
		if b.Health.Role == backend.RolePrimary {
			wantsPrimary[b.Name] = true
		}
	}
	if len(wantsPrimary) < 2 {
		return nil, ""
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
			// ClaimedRole, not State's role: a check that timed out leaves
			// the node up and picked (below fall), and a split must not end
			// on a rebuild until it is down or answers otherwise.
			if st, _ := t.B.State(); wantsPrimary[t.B.Name] && st == backend.StateUp && t.B.ClaimedRole() == backend.RolePrimary && !t.B.Draining() {
				claim = append(claim, t)
			}
		}
	}
	if len(claim) < 2 {
		return nil, ""
	}
	slices.SortFunc(claim, func(a, b *sched.Target) int { return order[a.B.Name] - order[b.B.Name] })
	for _, t := range claim {
		claimants = append(claimants, t.B.Name)
	}
	var keep *sched.Target
	switch cs.SplitBrain {
	case conf.SplitBrainFirst:
		keep = claim[0]
	case conf.SplitBrainNewest:
		keep = newest(claim)
	}
	if keep != nil {
		for _, t := range claim {
			if t != keep {
				t.Weight = 0
			}
		}
		return claimants, keep.B.Name
	}
	for _, ts := range [][]sched.Target{prim, back} {
		for i := range ts {
			ts[i].Weight = 0
		}
	}
	return claimants, ""
}

// newest returns the claimant on the highest timeline, or nil when two
// share it or one's is not known (0): then nobody can say which is the
// promoted one.
func newest(claim []*sched.Target) *sched.Target {
	var best *sched.Target
	var top uint64
	tie := false
	for _, t := range claim {
		tl := t.B.Timeline()
		if tl == 0 {
			return nil
		}
		switch {
		case tl > top:
			best, top, tie = t, tl, false
		case tl == top:
			tie = true
		}
	}
	if tie {
		return nil
	}
	return best
}

// swapped runs after each swap of the table (reload or health rebuild):
// it logs each service's split brain once as it starts and once as it
// ends, and counts it. (Publishing woke the connections held for an
// eligible backend: listener.Server.Publish.) As a split brain begins, or
// its claimants or writer change, the health controller cuts the sessions
// of the claimants not kept as the writer (health's CutSplitBrain).
func (m *Manager) swapped(old *sched.Table, next *listener.Snapshot) {
	m.watch.Swapped(next, time.Now())
	for _, s := range next.Services {
		var was []string
		var wasWriter string
		if old != nil {
			if os := old.Service(s.Name); os != nil {
				was, wasWriter = os.SplitBrain, os.SplitWriter
			}
		}
		changed := !slices.Equal(s.SplitBrain, was) || s.SplitWriter != wasWriter
		switch {
		case len(s.SplitBrain) > 0 && len(was) == 0:
			m.srv.SplitBrainBegan(s.Name)
			action := "refusing new connections"
			if s.SplitWriter != "" {
				action = "keeping only " + s.SplitWriter
			}
			m.log.Error().Str("service", s.Name).Str("backends", strings.Join(s.SplitBrain, ", ")).Str("writer", s.SplitWriter).
				Msg("split brain: more than one backend claims the primary role; " + action)
		case len(s.SplitBrain) == 0 && len(was) > 0:
			m.log.Warn().Str("service", s.Name).Str("backends_were", strings.Join(was, ", ")).
				Msg("split brain over: at most one backend claims the primary role")
		case len(s.SplitBrain) > 0 && changed:
			m.log.Error().Str("service", s.Name).Str("backends", strings.Join(s.SplitBrain, ", ")).Str("writer", s.SplitWriter).
				Msg("split brain: the claimants changed")
		}
		if len(s.SplitBrain) > 0 && changed {
			m.health.CutSplitBrain(s)
		}
	}
}
