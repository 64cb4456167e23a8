package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"fulcrum/listener"
	"fulcrum/sched"
	"fulcrum/status"
)

// snapOf is a Source's Snapshot func for table t, with no policies.
func snapOf(t *sched.Table) func() *listener.Snapshot {
	s := listener.NewSnapshot(t, nil)
	return func() *listener.Snapshot { return s }
}

func emptySource() Source {
	return Source{Source: status.Source{Version: "v9.9.9"},
		Build: map[string]string{"version": "v9.9.9", "commit": "abc", "go": "go1.26.8", "date": "2026-12-01T00:00:00Z"}}
}

// TestIndex: GET / names every endpoint, so that an operator who opens the
// admin address in a browser or with curl learns what is there.
func TestIndex(t *testing.T) {
	srv := httptest.NewServer(Handler(emptySource()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET / = %s", resp.Status)
	}
	for _, e := range endpoints {
		if !strings.Contains(string(body), e[0]) {
			t.Errorf("GET / lacks %q:\n%s", e[0], body)
		}
	}
	// Each listed GET answers; an unknown path is still a 404.
	for _, e := range endpoints {
		method, path, _ := strings.Cut(e[0], " ")
		if method != "GET" {
			continue
		}
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %s", path, resp.Status)
		}
	}
	resp, err = http.Get(srv.URL + "/nosuch")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("GET /nosuch = %s; want 404", resp.Status)
	}
}

func TestBuildInfo(t *testing.T) {
	mfs, err := registry(emptySource()).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fulcrum_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		want := map[string]string{"version": "v9.9.9", "revision": "abc", "goversion": "go1.26.8", "builddate": "2026-12-01T00:00:00Z"}
		for k, v := range want {
			if labels[k] != v {
				t.Errorf("fulcrum_build_info{%s=%q}; want %q", k, labels[k], v)
			}
		}
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("fulcrum_build_info = %v; want 1", v)
		}
		return
	}
	t.Error("no fulcrum_build_info")
}
