package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"fulcrum/internal/testkit"
)

// TestMetrics scrapes /metrics from the real daemon, parses it with the
// Prometheus text parser, and checks that the counters equal what the test
// itself sent.
func TestMetrics(t *testing.T) {
	be := testkit.NewServer(t, func(c *net.TCPConn) { // reads a request, answers twice its size
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		c.Write(bytes.Repeat(buf[:n], 2))
	}).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.web]
listen = ["127.0.0.1:0"]
backends = [{ name = "one", address = %q }, { name = "dead", address = %q, weight = 0 }]
`, be, testkit.DeadAddr(t)))
	adm := d.adminAddr(t) // logged first
	lb := d.listenAddr(t)

	const n = 7
	var in, out int
	for i := range n {
		c, err := net.Dial("tcp", lb)
		if err != nil {
			t.Fatal(err)
		}
		req := strings.Repeat("x", 100+i)
		c.Write([]byte(req))
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || len(b) != 2*len(req) {
			t.Fatalf("answer %d bytes, %v", len(b), err)
		}
		in, out = in+len(req), out+len(b)
	}
	for range n { // the access lines mark each session's end, and its counters
		d.await(t, "connection")
	}

	_, text := get(t, adm, "/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the Prometheus parser rejects /metrics: %v", err)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := families[name]
		if !ok {
			t.Fatalf("no metric %s", name)
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return 0
	}
	one := map[string]string{"service": "web", "backend": "one"}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"fulcrum_backend_connections_total", one, n},
		{"fulcrum_backend_active_connections", one, 0},
		{"fulcrum_backend_bytes_total", map[string]string{"service": "web", "backend": "one", "direction": "in"}, float64(in)},
		{"fulcrum_backend_bytes_total", map[string]string{"service": "web", "backend": "one", "direction": "out"}, float64(out)},
		{"fulcrum_backend_connect_failures_total", one, 0},
		{"fulcrum_backend_up", one, 1},
		{"fulcrum_backend_weight", one, 1},
		{"fulcrum_backend_weight", map[string]string{"backend": "dead"}, 0},
		{"fulcrum_backend_connections_total", map[string]string{"backend": "dead"}, 0},
		{"fulcrum_listener_accepts_total", map[string]string{"listen": "127.0.0.1:0"}, n},
		{"fulcrum_listener_accept_errors_total", nil, 0},
		{"fulcrum_service_active_connections", map[string]string{"service": "web"}, 0},
		{"fulcrum_service_queue_length", map[string]string{"service": "web"}, 0},
		{"fulcrum_service_refused_total", map[string]string{"service": "web"}, 0},
		{"fulcrum_service_retries_total", map[string]string{"service": "web"}, 0},
		{"fulcrum_config_generation", nil, 1},
		{"fulcrum_reloads_total", nil, 0},
		{"fulcrum_reload_failures_total", nil, 0},
		{"fulcrum_config_last_reload_successful", nil, 1},
	}
	for _, c := range checks {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_open_fds", "fulcrum_config_last_reload_timestamp_seconds", "fulcrum_build_info"} {
		if _, ok := families[name]; !ok {
			t.Errorf("no %s", name)
		}
	}

	// The same numbers in `fulcrum status`.
	var table, errOut strings.Builder
	if code := cli([]string{"status", "-admin", adm}, &table, &errOut); code != 0 {
		t.Fatalf("fulcrum status = %d: %s", code, errOut.String())
	}
	for _, want := range []string{"generation 1", "service web", "wrr", "one", be, fmt.Sprintf("%d B", in), "up", "dead", "127.0.0.1:0"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("status table lacks %q:\n%s", want, table.String())
		}
	}
}

// TestSetAndState drives the real daemon: `fulcrum set` holds a backend
// (shown in `fulcrum status`, /metrics and the log, refused cross-origin),
// the check metrics are served, and with [admin] state_file the instance
// drain and the override survive a restart.
func TestSetAndState(t *testing.T) {
	be := testkit.NewServer(t, testkit.Echo).Addr
	state := filepath.Join(t.TempDir(), "state.json")
	config := fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
state_file = %q
[services.web]
listen = ["127.0.0.1:0"]
backends = [{ name = "one", address = %q }, { name = "two", address = %q }, { name = "zero", address = %q, weight = 0 }]
[services.web.health]
check = "tcp"
interval = "100ms"
timeout = "100ms"
`, state, be, be, be)
	path := writeFile(t, "fulcrum.toml", config)
	d := startDaemonArgs(t, []string{"-config", path}, nil, nil)
	adm := d.adminAddr(t)
	d.await(t, "configuration applied")

	var out, errOut strings.Builder
	if code := cli([]string{"set", "-admin", adm, "web/two", "maint"}, &out, &errOut); code != 0 {
		t.Fatalf("fulcrum set = %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "web/two now maint") {
		t.Errorf("fulcrum set printed %q", out.String())
	}
	line := d.await(t, "backend override set")
	if line["component"] != "state" || line["backend"] != "two" || line["state"] != "maint" {
		t.Errorf("override log line %v", line)
	}
	for _, bad := range [][]string{{"web/nosuch", "drain"}, {"web/two", "sideways"}, {"web-two", "drain"}} {
		out.Reset()
		errOut.Reset()
		if code := cli(append([]string{"set", "-admin", adm}, bad...), &out, &errOut); code == 0 {
			t.Errorf("fulcrum set %v = 0; want an error", bad)
		}
	}
	// Same-origin rule: a browser's cross-site POST is refused.
	req, _ := http.NewRequest("POST", "http://"+adm+"/backends/web/one/drain", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %v %v; want 403", resp, err)
	} else {
		resp.Body.Close()
	}

	// The table: short states, weights, since and last check; -v adds the
	// whole reason on its own line.
	var table strings.Builder
	testkit.WaitFor(t, 10*time.Second, func() error { // the checks run on their own; no event but the table
		table.Reset()
		if code := cli([]string{"status", "-v", "-admin", adm}, &table, &errOut); code != 0 {
			t.Fatalf("fulcrum status = %d: %s", code, errOut.String())
		}
		if n := strings.Count(table.String(), " ok "); n < 3 {
			return fmt.Errorf("fulcrum status shows %d backends checked ok; want 3:\n%s", n, table.String())
		}
		return nil
	})
	for _, want := range []string{"maint (set maint)", "0/1", "draining (weight 0)", "last check", "ok ", "two: maint set by POST /backends/web/two/maint"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("status -v lacks %q:\n%s", want, table.String())
		}
	}
	_, metrics := get(t, adm, "/metrics")
	for _, want := range []string{
		`fulcrum_backend_up{backend="two",service="web"} 0`,
		`fulcrum_backend_up{backend="zero",service="web"} 0`,
		`fulcrum_backend_up{backend="one",service="web"} 1`,
		`fulcrum_backend_state{backend="two",service="web",state="maint"} 1`,
		`fulcrum_backend_state{backend="zero",service="web",state="draining"} 1`,
		`fulcrum_backend_check_duration_seconds_count{backend="one",service="web"}`,
		`fulcrum_backend_checks_total{backend="one",result="ok",service="web"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Drain the instance, stop, start again: both holds are back.
	if code := cli([]string{"drain", "-admin", adm}, &out, &errOut); code != 0 {
		t.Fatalf("fulcrum drain = %d: %s", code, errOut.String())
	}
	testkit.WaitFor(t, 10*time.Second, func() error { // the writer gives no event but the file
		data, _ := os.ReadFile(state)
		if !strings.Contains(string(data), "instance_drain") || !strings.Contains(string(data), `"maint"`) {
			return fmt.Errorf("state file after drain and set:\n%s\nwant instance_drain and maint", data)
		}
		return nil
	})
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.expectExit(t, 10*time.Second)
	d = startDaemonArgs(t, []string{"-config", path}, nil, nil)
	adm = d.adminAddr(t)
	d.await(t, "configuration applied")
	out.Reset()
	if code := cli([]string{"healthz", "-admin", adm}, &out, &errOut); code == 0 || !strings.Contains(out.String(), "draining since") {
		t.Errorf("healthz after restart = %d %q; want the drain kept", code, out.String())
	}
	table.Reset()
	cli([]string{"status", "-admin", adm}, &table, &errOut)
	if !strings.Contains(table.String(), "maint (set maint)") {
		t.Errorf("status after restart lacks the override:\n%s", table.String())
	}
	if code := cli([]string{"set", "-admin", adm, "web/two", "ready"}, &out, &errOut); code != 0 {
		t.Fatalf("fulcrum set ready = %d: %s", code, errOut.String())
	}
}

// TestAccessLine: one line per connection with HAProxy tcplog's timers —
// time queued, time to connect, retries, bytes each way, duration, the
// backend and its address, how it ended; a failed dial names the client
// and says that a retry follows.
func TestAccessLine(t *testing.T) {
	live := testkit.NewServer(t, testkit.Echo).Addr
	dead := testkit.DeadAddr(t)
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.web]
listen = ["127.0.0.1:0"]
scheduler = "first"
retries = 1
backends = [{ name = "dead", address = %q }, { name = "live", address = %q }]
`, dead, live))
	lb := d.listenAddr(t)
	c, err := net.Dial("tcp", lb)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	c.(*net.TCPConn).CloseWrite()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.ReadAll(c)
	c.Close()
	fail := d.await(t, "connect failed")
	if fail["backend"] != "dead" || fail["retry"] != true || fail["client"] != c.LocalAddr().String() || fail["component"] != "listener" {
		t.Errorf("connect failed line %v; want backend dead, retry, the client", fail)
	}
	line := d.await(t, "connection")
	for key, want := range map[string]any{"backend": "live", "backend_addr": live, "retries": 1.0, "bytes_in": 5.0, "bytes_out": 5.0,
		"end": "client close", "client": c.LocalAddr().String(), "service": "web"} {
		if line[key] != want {
			t.Errorf("access line %s = %v; want %v (%v)", key, line[key], want, line)
		}
	}
	for _, key := range []string{"queue_ms", "connect_ms", "duration_ms"} {
		if v, ok := line[key].(float64); !ok || v < 0 {
			t.Errorf("access line %s = %v; want a duration in ms", key, line[key])
		}
	}
	if line["connect_ms"].(float64) > line["duration_ms"].(float64) {
		t.Errorf("connect_ms %v above duration_ms %v", line["connect_ms"], line["duration_ms"])
	}
}
