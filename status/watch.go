package status

import (
	"sync"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/listener"
	"fulcrum/sched"
)

// Watcher follows each service's own state from one snapshot to the next:
// whether it has an eligible backend of its own, and if not, whether it
// runs on its fallback, holds new connections (hold_timeout) or refuses
// them. It logs each change once, records it in Events and keeps since
// when, and counts the times a service began to use its fallback. Swapped
// is called by the snapshot's one writer (reload) after every swap; the
// rest may be called from any goroutine. The zero value logs nowhere and
// records nothing.
type Watcher struct {
	Log    zerolog.Logger
	Events *backend.Events

	mu  sync.Mutex // protects svc
	svc map[string]*ServiceState
}

// ServiceState is a service's own state as the Watcher last saw it.
type ServiceState struct {
	// Serving is "own" while one of its own backends (or backups) is
	// eligible, "fallback" while it picks from its fallback's, "holding"
	// while it has nothing and holds new connections (hold_timeout), and
	// "refusing" while it has nothing and closes them at once.
	Serving string
	Since   time.Time // when Serving took its value
	// Fallback is the service whose backends it picks from now (Serving
	// "fallback"); Fallbacks counts the times it began to.
	Fallback  string
	Fallbacks uint64
}

// Serving's values.
const (
	ServingOwn      = "own"
	ServingFallback = "fallback"
	ServingHolding  = "holding"
	ServingRefusing = "refusing"
)

// Swapped reads the services of snapshot next, which was just swapped in,
// at now: it logs and records what changed.
func (w *Watcher) Swapped(next *listener.Snapshot, now time.Time) {
	if next == nil || next.Table == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.svc == nil {
		w.svc = map[string]*ServiceState{}
	}
	seen := make(map[string]bool, len(next.Services))
	for _, s := range next.Services {
		seen[s.Name] = true
		serving, fb := servingOf(s)
		hold := next.Policy(s).HoldTimeout
		if serving == ServingRefusing && hold > 0 {
			serving = ServingHolding
		}
		st := w.svc[s.Name]
		if st == nil { // first seen (at start, or added by a reload): its state, not a change
			st = &ServiceState{Serving: serving, Fallback: fb}
			w.svc[s.Name] = st
			continue
		}
		if st.Serving == serving && st.Fallback == fb {
			continue
		}
		if st.Since.IsZero() && serving == ServingOwn { // the first checks decided, as at every start
			st.Serving, st.Fallback = serving, fb
			continue
		}
		from := st.Serving
		if from == ServingFallback {
			from = "fallback " + st.Fallback
		}
		to := serving
		if serving == ServingFallback {
			to = "fallback " + fb
			st.Fallbacks++
		}
		st.Serving, st.Fallback, st.Since = serving, fb, now
		var reason string
		e := w.Log.Warn().Str("service", s.Name)
		switch serving {
		case ServingOwn:
			e = w.Log.Info().Str("service", s.Name)
			reason = "a backend of its own is eligible again"
			if from != ServingOwn {
				e.Str("was", from)
			}
		case ServingFallback:
			reason = "no backend of its own is eligible; new connections go to service " + fb
			e.Str("fallback", fb)
		case ServingHolding:
			reason = "no eligible backend; holding new connections up to " + hold.String()
			e.Dur("hold_timeout", hold)
		case ServingRefusing:
			reason = "no eligible backend; new connections are closed at once"
			if s.Fallback != nil {
				reason = "no eligible backend, its fallback's included; new connections are closed at once"
			}
		}
		e.Msg(reason)
		w.Events.Add(backend.Event{At: now, Service: s.Name, From: from, To: to, Reason: reason})
	}
	for name := range w.svc {
		if !seen[name] {
			delete(w.svc, name) // removed: a service of that name added later starts afresh
		}
	}
}

// State returns what the Watcher knows of service name; the zero
// ServiceState when it knows nothing.
func (w *Watcher) State(name string) ServiceState {
	if w == nil {
		return ServiceState{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.svc[name]; st != nil {
		return *st
	}
	return ServiceState{}
}

// servingOf says where a new connection to s would be picked from now, by
// the rule the listener routes by (sched.Service.Serving): its own
// backends, its fallback's (and which), or nowhere ("refusing"; the caller
// tells holding apart).
func servingOf(s *sched.Service) (serving, fallback string) {
	switch from, _, _ := s.Serving(); from {
	case nil:
		return ServingRefusing, ""
	case s:
		return ServingOwn, ""
	default:
		return ServingFallback, from.Name
	}
}
