// Package admin serves fulcrum's admin HTTP listener: /metrics in the
// Prometheus exposition format, /status as JSON, /healthz for the engines
// that put instances in and out of rotation (keepalived, BGP health
// checkers, Kubernetes), and POST /drain and /undrain; it prints the status
// as a table for `fulcrum status`.
//
// Apart from the drain requests, which it hands to the cluster.Instance, it
// only reads: the current snapshot (one atomic load per request), the
// reload history and the listener counters. Metrics are gathered at scrape
// time from the counters the data path keeps anyway, so serving them costs
// the connection path nothing.
//
// Typical use (main does this):
//
//	src := admin.Source{Table: ptr.Load, Reloads: m.Status, Sockets: srv.Sockets, Instance: inst}
//	go admin.Serve(ctx, ln, admin.Handler(src)) // returns when ctx ends
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"fulcrum/backend"
	"fulcrum/cluster"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/sched"
)

// Source is what the admin listener reads.
type Source struct {
	Table   func() *sched.Table           // the current snapshot
	Reloads func() reload.Status          // the reload history
	Sockets func() []listener.SocketStats // per-listener counters
	// Instance answers /healthz and takes POST /drain and /undrain; nil:
	// /healthz is always 200 and there is nothing to drain.
	Instance *cluster.Instance
	Version  string
	// Build describes the binary for fulcrum_build_info: keys version,
	// commit, go and date. Nil: the metric is not served.
	Build map[string]string
}

// endpoints is what GET / lists, in the order shown.
var endpoints = [][2]string{
	{"GET /metrics", "Prometheus metrics"},
	{"GET /status", "the live snapshot as JSON (what `fulcrum status` prints)"},
	{"GET /healthz", "200 while this instance should get traffic, else 503 and why"},
	{"POST /drain", "take the instance out of rotation (`fulcrum drain`)"},
	{"POST /undrain", "put it back (`fulcrum drain -undo`)"},
}

// registry holds every metric /metrics serves.
func registry(src Source) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{src: src})
	if b := src.Build; b != nil {
		// The usual *_build_info: 1, with the build in its labels, to join
		// on or to alert when instances run different builds.
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fulcrum_build_info",
			Help: "Always 1; the labels say which build is running.",
			ConstLabels: prometheus.Labels{"version": b["version"], "revision": b["commit"],
				"goversion": b["go"], "builddate": b["date"]},
		}, func() float64 { return 1 }))
	}
	return reg
}

// Handler serves /metrics and /status (and /healthz) for src.
func Handler(src Source) http.Handler {
	reg := registry(src)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "fulcrum %s admin listener\n\n", src.Version)
		for _, e := range endpoints {
			fmt.Fprintf(w, "%-14s %s\n", e[0], e[1])
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(Snapshot(src))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := true, "ok"
		if src.Instance != nil {
			ok, why = src.Instance.Healthy()
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(why + "\n"))
	})
	// POST only, and refused when a browser sends it from another origin:
	// a page the operator has open must not be able to drain the instance.
	drain := func(on bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if src.Instance == nil {
				http.Error(w, "no instance to drain", http.StatusNotFound)
				return
			}
			by := r.Method + " " + r.URL.Path + " from " + r.RemoteAddr
			changed := false
			if on {
				changed = src.Instance.Drain(by)
			} else {
				changed = src.Instance.Undrain(by)
			}
			st := src.Instance.Status()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "%s; /healthz: %s\n", drainWord(st.Draining, changed), st.Reason)
		}
	}
	mux.Handle("POST /drain", http.NewCrossOriginProtection().Handler(drain(true)))
	mux.Handle("POST /undrain", http.NewCrossOriginProtection().Handler(drain(false)))
	return mux
}

// drainWord says what a drain request did, in the words `fulcrum drain` prints.
func drainWord(draining, changed bool) string {
	switch {
	case draining && changed:
		return "draining"
	case draining:
		return "already draining"
	case changed:
		return "undrained"
	default:
		return "not draining"
	}
}

// Serve serves h on ln until ctx ends, then shuts down (in-flight requests
// get a second) and returns. It closes ln.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }() // exits when Shutdown closes ln
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Status is what /status returns: the live snapshot.
type Status struct {
	Version    string          `json:"version,omitempty"`
	Instance   *cluster.Status `json:"instance,omitempty"` // drain state and /healthz's verdict
	Generation uint64          `json:"generation"`
	Reload     ReloadStatus    `json:"reload"`
	Services   []ServiceStatus `json:"services"`
	Listeners  []ListenStatus  `json:"listeners"`
}

// ReloadStatus is the reload history.
type ReloadStatus struct {
	Applied     time.Time `json:"applied"`
	Reloads     uint64    `json:"reloads"`
	Failed      uint64    `json:"failed"`
	LastError   string    `json:"last_error,omitempty"`
	LastAttempt time.Time `json:"last_attempt"`
}

// ServiceStatus is one service.
type ServiceStatus struct {
	Name      string            `json:"name"`
	Scheduler string            `json:"scheduler"`
	Listen    []string          `json:"listen"`
	Active    int64             `json:"active"`  // connections holding a service slot
	Waiting   int64             `json:"waiting"` // in the queue now
	Retries   uint64            `json:"retries"`
	Queued    uint64            `json:"queued"`
	Refused   uint64            `json:"refused"`
	Rejected  map[string]uint64 `json:"rejected,omitempty"` // turned away before any dial, by reason
	Backends  []BackendStatus   `json:"backends"`
}

// BackendStatus is one backend: its settings in this generation and its live
// counters.
type BackendStatus struct {
	Name         string `json:"name"`
	Address      string `json:"address"`
	Weight       int    `json:"weight"` // effective: 0 while down, ramping during slow start
	Configured   int    `json:"configured_weight"`
	Backup       bool   `json:"backup,omitempty"`
	State        string `json:"state"` // up | down | draining
	Reason       string `json:"reason,omitempty"`
	Active       int64  `json:"active"`
	Total        uint64 `json:"total"`
	BytesIn      uint64 `json:"bytes_in"`
	BytesOut     uint64 `json:"bytes_out"`
	ConnectFails uint64 `json:"connect_failures"`
	DrainClosed  uint64 `json:"drain_closed"`
}

// ListenStatus is one listening socket.
type ListenStatus struct {
	Listen       string `json:"listen"`
	Addr         string `json:"addr"`
	Accepts      uint64 `json:"accepts"`
	AcceptErrors uint64 `json:"accept_errors"`
	Inherited    bool   `json:"inherited,omitempty"`
}

// Snapshot reads src into a Status.
func Snapshot(src Source) Status {
	st := Status{Version: src.Version}
	if src.Instance != nil {
		is := src.Instance.Status()
		st.Instance = &is
	}
	if t := src.Table(); t != nil {
		st.Generation = t.Gen
		for _, s := range t.Services {
			ss := ServiceStatus{Name: s.Name, Scheduler: s.Scheduler}
			if s.Group != nil {
				g := s.Group.Stats()
				ss.Active, ss.Waiting, ss.Retries, ss.Queued, ss.Refused = g.Active, g.Waiting, g.Retries, g.Queued, g.Refused
				for kind, n := range s.Group.Rejected() {
					if ss.Rejected == nil {
						ss.Rejected = map[string]uint64{}
					}
					ss.Rejected[backend.RejectNames[kind]] = n
				}
			}
			for _, a := range s.Listen {
				ss.Listen = append(ss.Listen, a.String())
			}
			for i, tg := range s.All() {
				b := tg.B.Stats()
				up, reason, _ := tg.B.Health()
				state := "up"
				switch {
				case b.Draining:
					state = "draining"
				case !up:
					state = "down"
				}
				ss.Backends = append(ss.Backends, BackendStatus{
					Name: tg.B.Name, Address: tg.Addr.String(), Weight: tg.Weight, Configured: tg.Base, Backup: i >= len(s.Targets),
					State: state, Reason: reason,
					Active: b.Active, Total: b.Total, BytesIn: b.BytesIn, BytesOut: b.BytesOut,
					ConnectFails: b.ConnectFails, DrainClosed: b.DrainClosed,
				})
			}
			st.Services = append(st.Services, ss)
		}
	}
	if src.Reloads != nil {
		r := src.Reloads()
		st.Reload = ReloadStatus{Applied: r.Applied, Reloads: r.Reloads, Failed: r.Failed, LastError: r.LastError, LastAttempt: r.LastAttempt}
	}
	if src.Sockets != nil {
		for _, so := range src.Sockets() {
			st.Listeners = append(st.Listeners, ListenStatus{Listen: so.Listen.String(), Addr: so.Addr,
				Accepts: so.Accepts, AcceptErrors: so.AcceptErrors, Inherited: so.Inherited})
		}
	}
	return st
}
