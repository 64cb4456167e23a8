// Package cluster decides whether this fulcrum instance should receive new
// traffic, for the engines that spread traffic over several instances and
// ask each one: keepalived tracking GET /healthz with a vrrp_script, a BGP
// health checker (ExaBGP's healthcheck, anycast-healthchecker, a script
// driving BIRD) withdrawing an anycast route, a Kubernetes readiness probe.
//
// It owns the instance's drain state. Draining the instance only changes
// the answer those engines read: the instance keeps serving every
// connection it gets, established or new, so the engine moves traffic away
// before anything is refused. Undrain turns the answer back. Stop marks the
// instance as shutting down for good (it cannot be undrained).
//
// The health rule (Healthy): serving only while the instance is neither
// draining nor stopping and at least one service has a backend that is up
// (weight above 0, not down, not draining). An instance with nothing to
// send traffic to must not attract it.
//
// Typical use: see Example. main passes a func that reads the table of the
// listener.Server's snapshot, and runs the signals:
//
//	go inst.Run(ctx, usr1usr2) // SIGUSR1 drains, SIGUSR2 undrains; Stop when ctx ends
//	ok, why := inst.Healthy()   // what /healthz answers
//
// It holds no goroutine of its own; Run belongs to its caller.
package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/sched"
)

// Instance is this fulcrum instance's place in a cluster.
type Instance struct {
	// OnChange, if set before use, is called after each Drain or Undrain
	// that changed the state (not Stop), outside the lock: the state file
	// keeps the operator's drain across restarts.
	OnChange func()

	tbl func() *sched.Table
	log zerolog.Logger

	mu       sync.Mutex // protects draining, stopping, by and since
	draining bool
	stopping bool
	by       string    // who drained it (or stopped it), for logs and /status
	since    time.Time // when draining or stopping began
}

// New returns a serving instance that reads the current snapshot with tbl.
func New(tbl func() *sched.Table, log zerolog.Logger) *Instance {
	return &Instance{tbl: tbl, log: log.With().Str("component", "cluster").Logger()}
}

// Status is the instance's state, for /status and metrics.
type Status struct {
	Draining bool      `json:"draining"`           // drained, or stopping
	Stopping bool      `json:"stopping,omitempty"` // shutting down: draining for good
	By       string    `json:"by,omitempty"`       // what drained it: "SIGUSR1", "POST /drain from …", "shutdown"
	Since    time.Time `json:"since,omitzero"`     // when draining began
	Healthy  bool      `json:"healthy"`            // what /healthz answers: true is 200
	Reason   string    `json:"reason"`             // /healthz's one line
}

// Drain takes the instance out of rotation: Healthy fails from now on,
// while every connection is still served. by says who asked. It reports
// whether the state changed; a change is logged once.
func (in *Instance) Drain(by string) bool {
	in.mu.Lock()
	if in.draining {
		in.mu.Unlock()
		return false
	}
	in.draining, in.by, in.since = true, by, time.Now()
	in.log.Warn().Str("by", by).Msg("instance draining: /healthz fails, connections are still served")
	in.mu.Unlock()
	if in.OnChange != nil {
		in.OnChange()
	}
	return true
}

// Undrain puts a drained instance back in rotation. It reports whether the
// state changed; a stopping instance stays drained.
func (in *Instance) Undrain(by string) bool {
	in.mu.Lock()
	if !in.draining || in.stopping {
		if in.stopping {
			in.log.Warn().Str("by", by).Msg("instance is stopping; it stays drained")
		}
		in.mu.Unlock()
		return false
	}
	in.draining, in.by, in.since = false, "", time.Time{}
	in.log.Info().Str("by", by).Msg("instance undrained: /healthz follows the backends again")
	in.mu.Unlock()
	if in.OnChange != nil {
		in.OnChange()
	}
	return true
}

// Drained reports an operator's drain, for the state file: who drained the
// instance and since when; ok is false when it is not drained, or only
// stopping.
func (in *Instance) Drained() (by string, since time.Time, ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.draining || (in.stopping && in.by == "shutdown") {
		return "", time.Time{}, false
	}
	return in.by, in.since, true
}

// Stop marks the instance as shutting down: drained for good.
func (in *Instance) Stop() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stopping {
		return
	}
	if !in.draining {
		in.by, in.since = "shutdown", time.Now()
	}
	in.draining, in.stopping = true, true
	in.log.Info().Msg("instance stopping: /healthz fails until exit")
}

// Run drains on SIGUSR1 and undrains on SIGUSR2 received on sig, until ctx
// ends; then it calls Stop and returns.
func (in *Instance) Run(ctx context.Context, sig <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			in.Stop()
			return
		case s := <-sig:
			switch s {
			case syscall.SIGUSR1:
				in.Drain("SIGUSR1")
			case syscall.SIGUSR2:
				in.Undrain("SIGUSR2")
			}
		}
	}
}

// Healthy is the health rule: whether this instance should receive new
// traffic, and one line saying why (or why not).
func (in *Instance) Healthy() (ok bool, why string) {
	st := in.Status()
	return st.Healthy, st.Reason
}

// Status returns the drain state and the health verdict.
func (in *Instance) Status() Status {
	in.mu.Lock()
	st := Status{Draining: in.draining, Stopping: in.stopping, By: in.by, Since: in.since}
	in.mu.Unlock()
	switch {
	case st.Stopping:
		st.Reason = "stopping"
	case st.Draining:
		st.Reason = fmt.Sprintf("draining since %s (%s)", st.Since.UTC().Format(time.RFC3339), st.By)
	default:
		st.Healthy, st.Reason = Serving(in.tbl())
	}
	return st
}

// Serving reports whether t gives traffic somewhere to go: at least one
// service with a backend that is up. The reason lists each service's up
// backends when none has any.
func Serving(t *sched.Table) (bool, string) {
	if t == nil {
		return false, "starting: no configuration applied yet"
	}
	var counts []string
	for _, s := range t.Services {
		all := s.All()
		up := 0
		for i := range all {
			if all[i].Up() {
				up++
			}
		}
		if up > 0 {
			return true, "ok"
		}
		counts = append(counts, fmt.Sprintf("%s 0/%d", s.Name, len(all)))
	}
	return false, "no service has a backend up: " + strings.Join(counts, ", ")
}
