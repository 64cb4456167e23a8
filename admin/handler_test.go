package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"fulcrum/cluster"
	"fulcrum/sched"
)

// call sends method path to srv with extra header pairs and returns the
// status code, the Content-Type and the body.
func call(t *testing.T, srv *httptest.Server, method, path string, header ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// instanceSource is emptySource with a cluster.Instance over no table: it
// is unhealthy ("starting") until drained or stopped, which say so instead.
func instanceSource() (Source, *cluster.Instance) {
	src := emptySource()
	src.Instance = cluster.New(func() *sched.Table { return nil }, zerolog.Nop())
	return src, src.Instance
}

// TestMetricsEndpoint: GET /metrics is the Prometheus text format with
// fulcrum's own families; other methods are refused.
func TestMetricsEndpoint(t *testing.T) {
	srv := httptest.NewServer(Handler(emptySource()))
	defer srv.Close()
	code, ctype, body := call(t, srv, "GET", "/metrics")
	if code != 200 || !strings.HasPrefix(ctype, "text/plain") {
		t.Fatalf("GET /metrics = %d %q", code, ctype)
	}
	for _, want := range []string{"\nfulcrum_build_info{", "\ngo_goroutines "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	if code, _, _ := call(t, srv, "POST", "/metrics"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics = %d; want 405", code)
	}
}

// TestStatusEndpoint: GET /status is indented JSON that decodes into
// Status, carrying the version and the instance's drain state.
func TestStatusEndpoint(t *testing.T) {
	src, in := instanceSource()
	in.Drain("test")
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	code, ctype, body := call(t, srv, "GET", "/status")
	if code != 200 || ctype != "application/json" {
		t.Fatalf("GET /status = %d %q", code, ctype)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("GET /status: %v:\n%s", err, body)
	}
	if st.Version != "v9.9.9" || st.Instance == nil || !st.Instance.Draining || st.Instance.By != "test" || st.Instance.Healthy {
		t.Errorf("/status = %+v, instance %+v; want v9.9.9, draining by test", st, st.Instance)
	}
	if !strings.Contains(body, "\n  \"") {
		t.Errorf("/status is not indented:\n%s", body)
	}
	if code, _, _ := call(t, srv, "POST", "/status"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /status = %d; want 405", code)
	}
}

// TestHealthzEndpoint: 200 "ok" without an instance, with a split brain
// noted but not failing; with an instance, 503 and the reason while it is
// starting, drained or stopping; never cached.
func TestHealthzEndpoint(t *testing.T) {
	srv := httptest.NewServer(Handler(emptySource()))
	defer srv.Close()
	if code, _, body := call(t, srv, "GET", "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("without an instance: /healthz = %d %q; want 200 ok", code, body)
	}

	// A split brain is reported, but does not fail the check: every
	// instance sees the same backends.
	split := emptySource()
	split.Snapshot = snapOf(&sched.Table{Services: []*sched.Service{{Name: "rw", SplitBrain: []string{"a", "b"}}}})
	srv1 := httptest.NewServer(Handler(split))
	defer srv1.Close()
	if code, _, body := call(t, srv1, "GET", "/healthz"); code != 200 || body != "ok; split brain in service rw: a, b claim primary\n" {
		t.Errorf("with a split brain: /healthz = %d %q; want 200 and the split", code, body)
	}

	src, in := instanceSource()
	srv2 := httptest.NewServer(Handler(src))
	defer srv2.Close()
	for _, tc := range []struct {
		name   string
		change func()
		prefix string
	}{
		{"starting", func() {}, "starting: no configuration applied yet"},
		{"drained", func() { in.Drain("SIGUSR1") }, "draining since "},
		{"stopping", in.Stop, "stopping"},
	} {
		tc.change()
		req, _ := http.NewRequest("GET", srv2.URL+"/healthz", nil)
		resp, err := srv2.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.HasPrefix(string(b), tc.prefix) || strings.Count(string(b), "\n") != 1 {
			t.Errorf("%s: /healthz = %d %q; want 503 and one line starting %q", tc.name, resp.StatusCode, b, tc.prefix)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s: Cache-Control %q; want no-store", tc.name, cc)
		}
	}
}

// TestDrainEndpoints: POST /drain and /undrain flip the instance and say
// whether anything changed, with who asked; GET and cross-origin browser
// requests are refused; without an instance there is nothing to drain.
func TestDrainEndpoints(t *testing.T) {
	src, in := instanceSource()
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		header       []string
		code         int
		prefix       string
		draining     bool
	}{
		{"POST", "/drain", nil, 200, "draining; /healthz: draining since ", true},
		{"POST", "/drain", nil, 200, "already draining", true},
		{"POST", "/undrain", nil, 200, "undrained; /healthz: starting", false},
		{"POST", "/undrain", nil, 200, "not draining", false},
		{"GET", "/drain", nil, 405, "", false},
		{"POST", "/drain", []string{"Sec-Fetch-Site", "cross-site"}, 403, "", false},
		{"POST", "/drain", []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, 403, "", false},
	} {
		code, _, body := call(t, srv, tc.method, tc.path, tc.header...)
		if code != tc.code || !strings.HasPrefix(body, tc.prefix) {
			t.Errorf("%s %s %v = %d %q; want %d %q…", tc.method, tc.path, tc.header, code, body, tc.code, tc.prefix)
		}
		if st := in.Status(); st.Draining != tc.draining {
			t.Errorf("after %s %s %v: draining %v; want %v", tc.method, tc.path, tc.header, st.Draining, tc.draining)
		}
	}
	call(t, srv, "POST", "/drain") // the by of a request names its path and client
	if by := in.Status().By; !strings.HasPrefix(by, "POST /drain from 127.0.0.1:") {
		t.Errorf("drained by %q; want the request", by)
	}

	srv2 := httptest.NewServer(Handler(emptySource()))
	defer srv2.Close()
	for _, path := range []string{"/drain", "/undrain"} {
		if code, _, body := call(t, srv2, "POST", path); code != 404 || !strings.Contains(body, "no instance to drain") {
			t.Errorf("without an instance: POST %s = %d %q; want 404", path, code, body)
		}
	}
}

// TestUpgradeEndpoint: POST /upgrade runs Source.Upgrade and prints the
// new pid, or its error as a 500; without Upgrade it is a 404; GET and
// cross-origin browser requests are refused and start nothing.
func TestUpgradeEndpoint(t *testing.T) {
	calls := 0
	var fail error
	src := emptySource()
	src.Upgrade = func() (int, error) {
		calls++
		if fail != nil {
			return 0, fail
		}
		return 4242, nil
	}
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	if code, _, body := call(t, srv, "POST", "/upgrade"); code != 200 || !strings.HasPrefix(body, "upgraded: pid 4242 serves; pid ") {
		t.Errorf("POST /upgrade = %d %q; want 200 and the new pid", code, body)
	}
	fail = errors.New("upgrade: the new process exited before it was ready: exit status 3")
	if code, _, body := call(t, srv, "POST", "/upgrade"); code != 500 || !strings.Contains(body, "exit status 3") {
		t.Errorf("POST /upgrade failing = %d %q; want 500 and why", code, body)
	}
	if code, _, _ := call(t, srv, "GET", "/upgrade"); code != 405 {
		t.Errorf("GET /upgrade = %d; want 405", code)
	}
	if code, _, _ := call(t, srv, "POST", "/upgrade", "Sec-Fetch-Site", "cross-site"); code != 403 {
		t.Errorf("cross-origin POST /upgrade = %d; want 403", code)
	}
	if calls != 2 {
		t.Errorf("Upgrade called %d times; want 2 (the refused requests start nothing)", calls)
	}

	src.Upgrade = nil
	srv2 := httptest.NewServer(Handler(src))
	defer srv2.Close()
	if code, _, _ := call(t, srv2, "POST", "/upgrade"); code != 404 {
		t.Errorf("without Upgrade: POST /upgrade = %d; want 404", code)
	}
}
