package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/health"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
	"fulcrum/status"
)

// TestRolesShown: a backend in the wrong role and a service in split brain
// are visible in /status, /healthz, /metrics and the status table.
func TestRolesShown(t *testing.T) {
	var pool backend.Pool
	a, b := pool.Get("rw", "a"), pool.Get("rw", "b")
	b.AwaitRole(backend.RolePrimary) // its first check decides at once
	svc := &sched.Service{Name: "rw", Scheduler: "first", SplitBrain: []string{"a", "c"},
		Targets: []sched.Target{{B: a, Weight: 1, Base: 1}, {B: b, Weight: 1, Base: 1}}}
	tbl := sched.NewTable(1, []*sched.Service{svc}, nil)
	wrongRole(t, b)
	src := Source{Source: status.Source{Snapshot: snapOf(tbl), Version: "test"}}
	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	var st Status
	if err := json.Unmarshal([]byte(get("/status")), &st); err != nil {
		t.Fatal(err)
	}
	bs := st.Services[0].Backends[1]
	if bs.State != "wrong role" || bs.Role != "replica" {
		t.Errorf("/status backend b: state %q role %q; want wrong role, replica", bs.State, bs.Role)
	}
	if got := st.Services[0].SplitBrain; len(got) != 2 {
		t.Errorf("/status split_brain = %v", got)
	}
	if h := get("/healthz"); !strings.Contains(h, "split brain in service rw: a, c claim primary") {
		t.Errorf("/healthz = %q; want the split brain named", h)
	}
	m := get("/metrics")
	for _, want := range []string{
		`fulcrum_backend_state{backend="b",service="rw",state="wrong_role"} 1`,
		`fulcrum_backend_role{backend="b",role="replica",service="rw"} 1`,
		`fulcrum_service_split_brain{service="rw"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var buf strings.Builder
	WriteTable(&buf, st)
	if !regexp.MustCompile(`(?m)^\s+b\s.*wrong role \(.*replica.*\)`).MatchString(buf.String()) || !strings.Contains(buf.String(), "SPLIT BRAIN: a, c claim primary") {
		t.Errorf("status table:\n%s", buf.String())
	}
}

// wrongRole runs b's role check against a scripted Redis replica until b
// is in the wrong role for a role = "primary" check.
func wrongRole(t *testing.T, b *backend.Backend) {
	t.Helper()
	info := "role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:1\r\nmaster_link_status:up\r\n"
	replica := testkit.NewServer(t, func(c *net.TCPConn) {
		c.Read(make([]byte, 512)) // INFO replication and QUIT, in one write
		fmt.Fprintf(c, "$%d\r\n%s\r\n+OK\r\n", len(info), info)
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { // exits when cancel is called
		defer close(done)
		health.RunChecks(ctx, b, health.CheckSpec{Probe: health.Probe{Kind: "redis", Role: "primary", Addr: replica.Addr, Timeout: time.Second},
			Interval: time.Second, Rise: 1, Fall: 1})
	}()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, 5*time.Second, func() error { // the check gives no event but the state
		if st, _ := b.State(); st != backend.StateWrongRole {
			return fmt.Errorf("backend b: state %v; want wrong role", st)
		}
		return nil
	})
}
