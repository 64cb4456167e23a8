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
// Typical use: see Example (main does this): a Source over the Server's
// snapshot (listener.Server.Snapshot) and reload's history, served with
// Serve(ctx, ln, Handler(src), opts) until ctx ends.
//
// The listener cannot starve the data path: it holds at most
// Options.MaxConns connections (64), each idle one closes after 30 s, and a
// slow request gets 5 s for its headers. Nor can other clients keep a
// health checker out: at the cap a new connection takes the place of the
// one that has waited longest for a request (silent, trickling its
// headers, or idle), and Accept waits only while every one is being
// served. It serves only requests whose Host names the listen address,
// localhost or one of [admin] hosts, so that a web page cannot reach it by
// rebinding its own DNS name to the admin address.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"fulcrum/backend"
	"fulcrum/status"
)

// Source is what the admin listener reads (the status, /metrics and
// /healthz read what status.Source names) and the few actions it takes.
type Source struct {
	status.Source
	// Set applies `fulcrum set SERVICE/BACKEND drain|maint|ready` (POST
	// /backends/{service}/{backend}/{state}); by says who asked. Nil: the
	// endpoint answers 404.
	Set func(service, name string, o backend.Override, by string) (changed bool, err error)
	// Promote applies `fulcrum set SERVICE/BACKEND writer` (POST
	// /backends/{service}/{backend}/writer): the backend becomes the writer
	// of its failback service. Nil: that state answers 404.
	Promote func(service, name, by string) (changed bool, err error)
	// Hosts are the names a request's Host may carry besides localhost and
	// the address the request came in on ([admin] hosts); lower case.
	Hosts []string
	// Build describes the binary for fulcrum_build_info: keys version,
	// commit, go and date. Nil: the metric is not served.
	Build map[string]string
	// Upgrade takes POST /upgrade: it hands the sockets to the binary now
	// installed and returns the new process's pid. Nil: 404.
	Upgrade func() (int, error)
	// Log reports the log writer (package logsink): lines dropped since
	// start because stderr did not take them, and whether it drops now.
	// Nil: fulcrum_log_dropped_total is not served.
	Log func() (dropped uint64, stalled bool)
	// History holds the console's per-backend samples (GET /history);
	// nil: it serves none. Its owner runs its sampler.
	History *History
}

// endpoints is what GET / lists, in the order shown.
var endpoints = [][2]string{
	{"GET /", "the web console, in a browser (this list otherwise)"},
	{"GET /metrics", "Prometheus metrics"},
	{"GET /status", "the live snapshot as JSON (what `fulcrum status` prints)"},
	{"GET /healthz", "200 while this instance should get traffic, else 503 and why"},
	{"GET /history", "the console's samples of the last minutes per backend, as JSON"},
	{"POST /drain", "take the instance out of rotation (`fulcrum drain`)"},
	{"POST /undrain", "put it back (`fulcrum drain -undo`)"},
	{"POST /backends/{service}/{backend}/{drain|maint|ready}", "hold one backend (`fulcrum set`)"},
	{"POST /backends/{service}/{backend}/writer", "make it the writer of its failback service (`fulcrum set`)"},
	{"POST /upgrade", "hand over to the binary now installed (`fulcrum upgrade`)"},
}

// registry holds every metric /metrics serves.
func registry(src Source) *prometheus.Registry { return registryWith(src, &healthRule{src: src}) }

// registryWith is registry, with the /healthz rule the handler uses, so
// that fulcrum_instance_healthy says what /healthz answers.
func registryWith(src Source, hz *healthRule) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{src: src, hz: hz})
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

// Handler serves /metrics and /status (and /healthz) for src, to requests
// whose Host is allowed (see hostAllowed); others get 421.
func Handler(src Source) http.Handler {
	mux := routes(src)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r, src.Hosts) {
			// Misdirected: this name does not lead here on purpose. A DNS
			// rebinding page sends its own name; it learns nothing.
			http.Error(w, fmt.Sprintf("host %q is not served here; name the listen address or localhost, or add the name to [admin] hosts", r.Host), http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether r's Host header names this listener: the IP
// address the request came in on, "localhost", or one of hosts (any port).
// A request without Host (HTTP/1.0) comes from no browser and is allowed.
func hostAllowed(r *http.Request, hosts []string) bool {
	h := r.Host
	if h == "" {
		return true
	}
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
	if h == "localhost" || slices.Contains(hosts, h) {
		return true
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return false
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	la, err := netip.ParseAddrPort(local.String())
	return err == nil && la.Addr().Unmap() == ip.Unmap()
}

// routes is the handler for requests that passed the Host check.
func routes(src Source) *http.ServeMux {
	hz := &healthRule{src: src}
	reg := registryWith(src, hz)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if wantsHTML(r) {
			serveConsole(w, r, "index.html")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "fulcrum %s admin listener\n\n", src.Version)
		for _, e := range endpoints {
			fmt.Fprintf(w, "%-14s %s\n", e[0], e[1])
		}
	})
	mux.HandleFunc("GET /console/{file}", func(w http.ResponseWriter, r *http.Request) {
		serveConsole(w, r, r.PathValue("file"))
	})
	mux.HandleFunc("GET /history", func(w http.ResponseWriter, r *http.Request) {
		var h HistoryJSON
		if src.History != nil {
			h = src.History.JSON()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(h)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(Snapshot(src))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := hz.check(time.Now())
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
			by := who(r)
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
	// The Host check above makes the Origin comparison these do sound: a
	// request is same-origin only with a Host that names this listener.
	mux.Handle("POST /undrain", http.NewCrossOriginProtection().Handler(drain(false)))
	mux.Handle("POST /upgrade", http.NewCrossOriginProtection().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if src.Upgrade == nil {
			http.Error(w, "upgrade not supported here", http.StatusNotFound)
			return
		}
		pid, err := src.Upgrade()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "upgraded: pid %d serves; pid %d drains\n", pid, os.Getpid())
	})))
	// Same rules as /drain: POST, and same-origin for browsers.
	mux.Handle("POST /backends/{service}/{backend}/{state}", http.NewCrossOriginProtection().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("state") == "writer" {
			promote(w, r, src.Promote)
			return
		}
		if src.Set == nil {
			http.Error(w, "no backends to set", http.StatusNotFound)
			return
		}
		o, ok := backend.ParseOverride(r.PathValue("state"))
		if !ok {
			http.Error(w, fmt.Sprintf("state %q is not one of drain, maint, ready, writer", r.PathValue("state")), http.StatusBadRequest)
			return
		}
		svc, name := r.PathValue("service"), r.PathValue("backend")
		changed, err := src.Set(svc, name, o, who(r))
		if err != nil {
			http.Error(w, err.Error()+validNames(src, svc), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		word := "now"
		if !changed {
			word = "already"
		}
		fmt.Fprintf(w, "%s/%s %s %s\n", svc, name, word, o)
	})))
	return mux
}

// promote answers POST /backends/{service}/{backend}/writer.
func promote(w http.ResponseWriter, r *http.Request, do func(service, name, by string) (bool, error)) {
	if do == nil {
		http.Error(w, "no writers to set", http.StatusNotFound)
		return
	}
	svc, name := r.PathValue("service"), r.PathValue("backend")
	changed, err := do(svc, name, who(r))
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	word := "now"
	if !changed {
		word = "already"
	}
	fmt.Fprintf(w, "%s/%s %s the writer\n", svc, name, word)
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

// Options bound what the admin listener may cost. Zero values take the
// defaults.
type Options struct {
	// Log receives net/http's own error lines (accept errors, for one) as
	// JSON, at most a few a second. The zero Logger writes nowhere.
	Log zerolog.Logger
	// MaxConns is how many connections are held at once; default 64. At the
	// cap the listener closes the idle keep-alive connections and answers
	// with Connection: close so that busy ones cycle (keep-alive resumes
	// below half the cap), and each new connection takes the place of the
	// one that has waited longest for its request; only while all are being
	// served does it stop accepting (the kernel queues the rest).
	MaxConns int
	// IdleTimeout closes a keep-alive connection idle this long; default 30s.
	IdleTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers; default 5s. The
	// whole request gets twice that, the response 30s.
	ReadHeaderTimeout time.Duration
}

// DefaultMaxConns is Options.MaxConns's default: a few scrapers, probes and
// operators, with room to spare.
const DefaultMaxConns = 64

// Serve serves h on ln until ctx ends, then shuts down (in-flight requests
// get a second) and returns. It closes ln.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, o Options) error {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Second
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 5 * time.Second
	}
	lim := newLimitListener(ln, o.MaxConns)
	sampled := o.Log.With().Str("component", "admin").Logger().Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Second})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lim.full() {
				w.Header().Set("Connection", "close") // at the cap: let the next one in
			}
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       2 * o.ReadHeaderTimeout,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          log.New(logWriter{sampled}, "", 0),
	}
	// At the cap, idle keep-alive connections go first: a probe waiting in
	// the kernel's queue gets in at once, not after an idle timeout.
	lim.shed = func(on bool) { srv.SetKeepAlivesEnabled(!on) }
	srv.ConnState = lim.track
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lim) }() // exits when Shutdown closes ln
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// logWriter turns net/http's log lines into zerolog events, so that the
// log stays one JSON object per line.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// limitListener holds at most cap connections. At the cap, a new one takes
// the place of the connection that has waited longest for a request (a
// silent or slow one reading its headers, or an idle keep-alive): a client
// that sends its request at once, as a health checker does, cannot be kept
// out by others that send theirs slowly or not at all, however many they
// are. Only when every connection is being served (its request read) does
// Accept wait for one to close, the one accepted meanwhile holding the only
// descriptor beyond the cap.
type limitListener struct {
	net.Listener
	cap      int
	shed     func(on bool) // called with true when the cap is reached, false when below half again; nil: no-op
	shedding atomic.Bool   // shed(true) was the last call

	mu    sync.Mutex          // protects conns
	conns map[*limitConn]bool // open connections
	freed chan struct{}       // a connection closed; buffered 1
	done  chan struct{}       // closed by Close: Accept stops waiting
	once  sync.Once
	open  atomic.Int64 // len(conns), for full without the lock
}

func newLimitListener(ln net.Listener, cap int) *limitListener {
	return &limitListener{Listener: ln, cap: cap, conns: map[*limitConn]bool{}, freed: make(chan struct{}, 1),
		done: make(chan struct{})}
}

// full reports whether the cap is reached.
func (l *limitListener) full() bool { return l.open.Load() >= int64(l.cap) }

func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitConn{Conn: c, l: l}
	lc.wait(time.Now())
	for {
		l.mu.Lock()
		if len(l.conns) < l.cap {
			l.conns[lc] = true
			n := int64(len(l.conns))
			l.open.Store(n)
			l.mu.Unlock()
			if n >= int64(l.cap) && l.shed != nil && l.shedding.CompareAndSwap(false, true) {
				l.shed(true)
			}
			return lc, nil
		}
		victim := l.longestWaiting()
		l.mu.Unlock()
		if victim != nil {
			victim.Close() // its handler's reads fail; it gives its place back now
			continue
		}
		select {
		case <-l.freed:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

// longestWaiting returns the open connection that has waited longest for
// a request, or nil when every one is being served. Called with mu held.
func (l *limitListener) longestWaiting() *limitConn {
	var v *limitConn
	var since int64
	for c := range l.conns {
		if s := c.since.Load(); s != 0 && (v == nil || s < since) {
			v, since = c, s
		}
	}
	return v
}

// track follows net/http's view of each connection (http.Server.ConnState):
// new and idle ones wait for a request (reading its headers, or silent),
// active ones have one and are served.
func (l *limitListener) track(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		lc.wait(time.Now())
	case http.StateActive:
		lc.since.Store(0)
	}
}

// release gives back a closed connection's place.
func (l *limitListener) release(c *limitConn) {
	l.mu.Lock()
	delete(l.conns, c)
	n := int64(len(l.conns))
	l.open.Store(n)
	l.mu.Unlock()
	if n <= int64(l.cap/2) && l.shed != nil && l.shedding.CompareAndSwap(true, false) {
		l.shed(false)
	}
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its place back once, when closed.
type limitConn struct {
	net.Conn
	l     *limitListener
	since atomic.Int64 // when it began to wait for a request (UnixNano); 0 while one is served
	once  sync.Once
}

func (c *limitConn) wait(now time.Time) { c.since.Store(max(now.UnixNano(), 1)) }

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// The /status types are the one status type of package status; these names
// keep admin's callers and tests as they were.
type (
	Status        = status.Status
	ReloadStatus  = status.Reload
	ServiceStatus = status.Service
	BackendStatus = status.Backend
	ListenStatus  = status.Listener
)

// Snapshot reads src into a Status.
func Snapshot(src Source) Status { return status.Of(src.Source) }
