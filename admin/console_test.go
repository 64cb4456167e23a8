package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/listener"
	"fulcrum/sched"
	"fulcrum/status"
)

// TestConsolePage: a browser gets the console, curl the index; the page
// and its files come from the binary, name nothing elsewhere, and are
// served under a policy that forbids inline script and framing.
func TestConsolePage(t *testing.T) {
	srv := httptest.NewServer(Handler(emptySource()))
	defer srv.Close()
	get := func(path, accept string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := get("/", "text/html,application/xhtml+xml,*/*;q=0.8")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") || !strings.Contains(body, `src="/console/console.js"`) {
		t.Errorf("GET / from a browser: %s %q; want the console page", ct, body[:min(len(body), 200)])
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("the console's policy %q; want its own scripts only and no framing", csp)
	}
	if _, body := get("/", "*/*"); !strings.Contains(body, "admin listener") {
		t.Errorf("GET / from curl: %q; want the text index", body)
	}
	for _, f := range []string{"console.js", "console.css"} {
		if resp, _ := get("/console/"+f, "*/*"); resp.StatusCode != 200 {
			t.Errorf("GET /console/%s = %s", f, resp.Status)
		}
	}
	if resp, _ := get("/console/../admin.go", "*/*"); resp.StatusCode != 404 {
		t.Errorf("GET /console/../admin.go = %s; want 404", resp.Status)
	}
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	fs.WalkDir(console, "console", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := console.ReadFile(p)
		if m := external.FindString(string(b)); m != "" {
			t.Errorf("%s names %q: the console must need nothing from elsewhere", p, m)
		}
		return nil
	})
}

// TestHistory: samples of the running table's backends (and those
// draining after their removal) become per-backend series of connections,
// new connections per second and check latency, oldest first, bounded.
func TestHistory(t *testing.T) {
	var pool backend.Pool
	b, gone := pool.Get("s", "b"), pool.Get("s", "gone")
	tbl := sched.NewTable(1, []*sched.Service{{Name: "s", Targets: []sched.Target{{B: b, Weight: 1, Base: 1}}}}, nil)
	var drains []status.Drain
	src := status.Source{Snapshot: snapOf(tbl), Draining: func() []status.Drain { return drains }}
	h := &History{Len: 3}
	t0 := time.Unix(1000, 0)
	open := func(n int) {
		for range n {
			b.Acquire(0)
		}
	}
	open(1)
	h.Sample(src, t0, 0)
	open(4) // 5 open, 5 in all
	h.Sample(src, t0.Add(time.Second), time.Second)
	open(6) // 11, 11
	h.Sample(src, t0.Add(3*time.Second), 2*time.Second)
	b.Release()
	drains = []status.Drain{{B: gone}} // removed, still draining: in view
	h.Sample(src, t0.Add(4*time.Second), time.Second)
	got, _ := json.Marshal(h.JSON())
	want := `{"times":[1001000,1003000,1004000],"series":{"s/b":{"conns":[5,11,10],"rate":[4,3,0],"latency_ms":[null,null,null]},` +
		`"s/gone":{"conns":[null,null,0],"rate":[null,null,null],"latency_ms":[null,null,null]}}}`
	if string(got) != want {
		t.Errorf("history %s; want %s", got, want)
	}
	src.Snapshot, drains = nil, nil
	for range 3 { // gone for a whole ring: forgotten
		h.Sample(src, t0.Add(5*time.Second), time.Second)
	}
	if j := h.JSON(); len(j.Series) != 0 {
		t.Errorf("a backend gone for %d samples is still kept: %v", 3, j.Series)
	}
	h = &History{Len: 3, MaxSeries: 2}
	many := sched.NewTable(1, []*sched.Service{{Name: "s", Targets: []sched.Target{{B: pool.Get("s", "a")}, {B: b}, {B: pool.Get("s", "c")}}}}, nil)
	h.Sample(status.Source{Snapshot: snapOf(many)}, t0, 0)
	if j := h.JSON(); len(j.Series) != 2 || j.Series["s/c"].Conns != nil {
		t.Errorf("with MaxSeries 2, series %v; want s/a and s/b only", j.Series)
	}
}

// TestSetTypoListsNames: a `fulcrum set` for a backend or service that
// does not exist is answered with the names that do.
func TestSetTypoListsNames(t *testing.T) {
	tbl := &sched.Table{Gen: 1, Services: []*sched.Service{
		{Name: "ro", Targets: []sched.Target{{B: backend.New("ro", "pg2")}, {B: backend.New("ro", "pg3")}}},
		{Name: "rw", Targets: []sched.Target{{B: backend.New("rw", "pg1")}}},
	}}
	src := emptySource()
	src.Snapshot = snapOf(tbl)
	src.Set = func(svc, name string, o backend.Override, by string) (bool, error) {
		return false, fmt.Errorf("no backend %q in service %s", name, svc)
	}
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	for path, want := range map[string]string{
		"/backends/ro/pg9/drain": `no backend "pg9" in service ro; its backends: pg2, pg3`,
		"/backends/r/pg2/drain":  "; the backends: ro/pg2, ro/pg3, rw/pg1",
	} {
		resp, err := http.Post(srv.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(string(b), want) {
			t.Errorf("POST %s = %d %q; want 404 and %q", path, resp.StatusCode, b, want)
		}
	}
}

// TestTableFallbackAndEvents: fulcrum status shows a service on its
// fallback with since when, what ended without a backend, a replica's
// lag and the credentials hint; -events prints the ring.
func TestTableFallbackAndEvents(t *testing.T) {
	now := time.Now()
	lag := 1.5
	st := Status{Generation: 4, Services: []status.Service{{
		Name: "ro", Scheduler: "wlc", Serving: status.ServingFallback, Fallback: "rw", ServingSince: now.Add(-90 * time.Second),
		Unserved: map[string]uint64{"no backend": 30, "connect failed": 2}, Fallbacks: 2, Hint: "every backend refuses the check's login",
		Backends: []status.Backend{{Name: "pg2", State: "down", Cause: "check", Role: "replica", LagSeconds: &lag, Transitions: 3, DowntimeSeconds: 75}},
	}}}
	var b strings.Builder
	writeTable(&b, st, true, now)
	for _, want := range []string{
		"fallback: rw (since " + now.Add(-90*time.Second).Local().Format(time.TimeOnly) + ", 1m30s ago)",
		"ended without a backend: connect failed 2, no backend 30;  held 0 (expired 0);  fallbacks 2",
		"hint: every backend refuses the check's login",
		"down (check, replica, lag 1.50s)",
		"pg2: 3 state changes, down 1m15s in all",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	at := time.Date(2026, 12, 1, 20, 30, 10, 393e6, time.Local)
	WriteEvents(&b, []backend.Event{{Seq: 1, At: at, Service: "ro", Backend: "pg1", From: "up", To: "down", Reason: "check failed 2 times"},
		{Seq: 2, At: at, Service: "ro", From: "own", To: "fallback rw", Reason: "no backend of its own is eligible"}})
	for _, want := range []string{"2026-12-01 20:30:10.393  ro/pg1  up → down", "ro      own → fallback rw"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("events lack %q:\n%s", want, b.String())
		}
	}
}

// TestHistoryMetrics: the fallback, the connections ended without a
// backend and a backend's transitions are served as metrics.
func TestHistoryMetrics(t *testing.T) {
	var pool backend.Pool
	r, w := pool.Get("ro", "r"), pool.Get("rw", "w")
	rw := &sched.Service{Name: "rw", Scheduler: "wrr", Targets: []sched.Target{{B: w, Weight: 1, Base: 1}}}
	ro := &sched.Service{Name: "ro", Scheduler: "wrr", Targets: []sched.Target{{B: r, Weight: 1, Base: 1}}, Fallback: rw}
	tbl := sched.NewTable(1, []*sched.Service{ro, rw}, nil)
	watch := &status.Watcher{Events: &pool.Events}
	watch.Swapped(listener.NewSnapshot(tbl, nil), time.Now()) // first sight: ro on its own
	r.StartDown("test: down")
	watch.Swapped(listener.NewSnapshot(tbl, nil), time.Now())
	src := emptySource()
	src.Admission = func(service string) (listener.AdmissionStats, bool) { // one connection of ro ended without a backend
		if service == "ro" {
			return listener.AdmissionStats{Unserved: map[string]uint64{"no backend": 1}}, true
		}
		return listener.AdmissionStats{}, true
	}
	src.Snapshot, src.Watcher, src.Events = snapOf(tbl), watch, pool.Events.List
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`fulcrum_service_fallback{fallback="rw",service="ro"} 1`,
		`fulcrum_service_serving{service="ro",serving="fallback"} 1`,
		`fulcrum_service_fallbacks_total{service="ro"} 1`,
		`fulcrum_service_unserved_total{reason="no backend",service="ro"} 1`,
		`fulcrum_backend_transitions_total{backend="r",service="ro"} 1`,
		`fulcrum_backend_state_since_timestamp_seconds{backend="r",service="ro"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if ev := pool.Events.List(); len(ev) != 2 || ev[0].To != "down" || ev[1].To != "fallback rw" {
		t.Errorf("events %+v; want r down, then ro on its fallback", ev)
	}
}
