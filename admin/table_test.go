package admin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/status"
)

// TestTable: a state is a short cause, so one long reason never pads every
// row; -v puts the reason on its own line; weights show effective/configured;
// a draining backend shows its time left; a check shows result and latency;
// a service's connections show with its max_conns.
func TestTable(t *testing.T) {
	now := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	long := "check failed 3 times: dial tcp 127.0.0.1:55432: connect: connection refused, and a great deal more text"
	st := Status{Generation: 2, Services: []status.Service{{Name: "pg", Scheduler: "lc", Active: 4, MaxConns: 100, Backends: []status.Backend{
		{Name: "a", Address: "127.0.0.1:1", Weight: 3, Configured: 3, State: "up",
			LastCheck: &status.LastCheck{At: now.Add(-time.Second), OK: true, LatencyMS: 1.25}},
		{Name: "b", Address: "127.0.0.1:2", Weight: 0, Configured: 1, State: "down", Cause: "check", Reason: long, Since: now.Add(-192 * time.Second),
			LastCheck: &status.LastCheck{At: now, Error: "dial tcp 127.0.0.1:55432: connect: connection refused", LatencyMS: 0.3}},
		{Name: "c", Address: "127.0.0.1:3", State: "draining", Cause: "removed", Removed: true, Active: 1, DrainDeadline: now.Add(9 * time.Second)},
	}}}}
	var short, verbose strings.Builder
	writeTable(&short, st, false, now)
	writeTable(&verbose, st, true, now)
	for _, want := range []string{"active 4/100", "down (check)", "0/1", "3m12s ago", "ok 1.2ms, 1s ago", "failed 300µs, 0s ago", "draining (removed, 9s left)"} {
		if !strings.Contains(short.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, short.String())
		}
	}
	if strings.Contains(short.String(), long) {
		t.Errorf("table without -v holds the long reason:\n%s", short.String())
	}
	for _, l := range strings.Split(short.String(), "\n") {
		if len(l) > 160 {
			t.Errorf("row of %d characters: %q", len(l), l)
		}
	}
	if !strings.Contains(verbose.String(), "  b: "+long+"\n") {
		t.Errorf("-v lacks b's reason on its own line:\n%s", verbose.String())
	}
	if strings.Contains(verbose.String(), "last check: dial tcp") {
		t.Errorf("-v repeats a check error its reason holds:\n%s", verbose.String())
	}
}

// TestSetEndpoint: POST /backends/{service}/{backend}/{state} hands a valid
// state to Source.Set with who asked, refuses an unknown state and a
// cross-origin browser, and says whether anything changed.
func TestSetEndpoint(t *testing.T) {
	type call struct {
		svc, name string
		o         backend.Override
		by        string
	}
	var calls []call
	src := emptySource()
	src.Set = func(svc, name string, o backend.Override, by string) (bool, error) {
		if name == "nosuch" {
			return false, errors.New("no backend \"nosuch\" in service pg")
		}
		calls = append(calls, call{svc, name, o, by})
		return len(calls) == 1, nil
	}
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	post := func(path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path   string
		header []string
		code   int
		body   string
	}{
		{"/backends/pg/a/maint", nil, 200, "pg/a now maint"},
		{"/backends/pg/a/maint", nil, 200, "pg/a already maint"},
		{"/backends/pg/a/sideways", nil, 400, "not one of drain, maint, ready, writer"},
		{"/backends/pg/nosuch/drain", nil, 404, "no backend"},
		{"/backends/pg/a/ready", []string{"Sec-Fetch-Site", "cross-site"}, 403, ""},
	} {
		code, body := post(tc.path, tc.header...)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("POST %s = %d %q; want %d %q", tc.path, code, body, tc.code, tc.body)
		}
	}
	if len(calls) != 2 || calls[0] != (call{"pg", "a", backend.Maint, calls[0].by}) || !strings.HasPrefix(calls[0].by, "POST /backends/pg/a/maint from 127.0.0.1:") {
		t.Errorf("Set calls %+v; want two for pg/a maint, by the request", calls)
	}
	src.Set = nil
	srv2 := httptest.NewServer(Handler(src))
	defer srv2.Close()
	if resp, err := http.Post(srv2.URL+"/backends/pg/a/drain", "", nil); err != nil || resp.StatusCode != 404 {
		t.Errorf("without Set: %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
}
