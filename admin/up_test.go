package admin

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/cluster"
	"fulcrum/sched"
)

// TestUpOneRule: /status, /healthz, /metrics and fulcrum status say a
// backend is up by one rule, the one the schedulers pick by
// (sched.Target.Up): while a split brain zeroes the claimants' weights
// (as reload builds the table: every target's with split_brain =
// "refuse", all but the writer's with "first"), a claimant given no
// weight is not up anywhere, and /healthz fails only when no backend is.
func TestUpOneRule(t *testing.T) {
	for _, c := range []struct {
		name    string
		weights []int  // a's and b's effective weights; configured 1 each
		writer  string // SplitWriter
		up      string // the STATUS= count
	}{
		{"refuse", []int{0, 0}, "", "backends 0/2 up"},
		{"first", []int{1, 0}, "a", "backends 1/2 up"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var pool backend.Pool
			svc := &sched.Service{Name: "rw", Scheduler: "first", SplitBrain: []string{"a", "b"}, SplitWriter: c.writer,
				Targets: []sched.Target{{B: pool.Get("rw", "a"), Weight: c.weights[0], Base: 1}, {B: pool.Get("rw", "b"), Weight: c.weights[1], Base: 1}}}
			tbl := sched.NewTable(1, []*sched.Service{svc}, nil)
			src := emptySource()
			src.Snapshot = snapOf(tbl)
			src.Instance = cluster.New(func() *sched.Table { return tbl }, zerolog.Nop())
			srv := httptest.NewServer(Handler(src))
			defer srv.Close()
			var st Status
			_, _, body := call(t, srv, "GET", "/status")
			if err := json.Unmarshal([]byte(body), &st); err != nil {
				t.Fatal(err)
			}
			_, _, metrics := call(t, srv, "GET", "/metrics")
			anyUp := false
			for i, tg := range svc.Targets {
				b := st.Services[0].Backends[i]
				anyUp = anyUp || tg.Up()
				if b.Up() != tg.Up() {
					t.Errorf("/status has %s %s (%s: %s), up %v; the schedulers' rule says up %v", b.Name, b.State, b.Cause, b.Reason, b.Up(), tg.Up())
				}
				if !tg.Up() && (b.Cause != "split brain" || !strings.HasPrefix(b.Reason, "split brain: a, b claim primary; ")) {
					t.Errorf("/status has %s %s (%s: %s); want it draining by the split brain", b.Name, b.State, b.Cause, b.Reason)
				}
				if want := fmt.Sprintf("fulcrum_backend_up{backend=%q,service=\"rw\"} %d", b.Name, map[bool]int{true: 1}[tg.Up()]); !strings.Contains(metrics, want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
			if line := st.Line(); !strings.Contains(line, c.up) {
				t.Errorf("STATUS= %q; want %q", line, c.up)
			}
			code, _, body := call(t, srv, "GET", "/healthz")
			if want := map[bool]int{true: 200, false: 503}[anyUp]; code != want {
				t.Errorf("/healthz = %d %q; want %d", code, body, want)
			}
			if ok := st.Instance.Healthy; ok != anyUp {
				t.Errorf("/status instance healthy %v; want %v", ok, anyUp)
			}
		})
	}
}
