package cluster

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// table builds a snapshot with one service per entry; each backend is
// given as "name" (up), "name:0" (weight 0), "name:down" or "name:draining",
// with a "+" prefix for a backup.
func table(t *testing.T, services map[string][]string) *sched.Table {
	t.Helper()
	var svcs []*sched.Service
	for name, bs := range services {
		s := &sched.Service{Name: name}
		for _, spec := range bs {
			backup := strings.HasPrefix(spec, "+")
			bname, state, _ := strings.Cut(strings.TrimPrefix(spec, "+"), ":")
			b := backend.New(name, bname)
			tg := sched.Target{B: b, Weight: 1, Base: 1}
			switch state {
			case "0":
				tg.Weight, tg.Base = 0, 0
			case "down":
				if !b.PassiveFail(1, time.Hour, time.Now()) {
					t.Fatalf("%s: PassiveFail did not take it down", spec)
				}
			case "draining":
				b.StopNew()
			}
			if backup {
				s.Backups = append(s.Backups, tg)
			} else {
				s.Targets = append(s.Targets, tg)
			}
		}
		svcs = append(svcs, s)
	}
	return sched.NewTable(1, svcs, nil)
}

func TestServing(t *testing.T) {
	tests := []struct {
		name     string
		services map[string][]string
		ok       bool
		why      string
	}{
		{"one up", map[string][]string{"pg": {"a", "b:down"}}, true, "ok"},
		{"all down", map[string][]string{"pg": {"a:down", "b:draining"}}, false, "no service has a backend up: pg 0/2"},
		{"weight 0 is not up", map[string][]string{"pg": {"a:0"}}, false, "no service has a backend up: pg 0/1"},
		{"a backup serves", map[string][]string{"pg": {"a:down", "+b"}}, true, "ok"},
		{"another service up", map[string][]string{"pg": {"a:down"}, "redis": {"r"}}, true, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, why := Serving(table(t, tt.services))
			if ok != tt.ok || why != tt.why {
				t.Errorf("Serving = %v, %q; want %v, %q", ok, why, tt.ok, tt.why)
			}
		})
	}
	if ok, why := Serving(nil); ok || !strings.HasPrefix(why, "starting") {
		t.Errorf("Serving(nil) = %v, %q; want false, starting", ok, why)
	}
}

// TestDrainFlips: draining fails the health rule whatever the backends say,
// undraining restores it, each flip is logged once however often it is
// asked for, and a stopping instance cannot be undrained.
func TestDrainFlips(t *testing.T) {
	var ptr atomic.Pointer[sched.Table]
	ptr.Store(table(t, map[string][]string{"pg": {"a"}}))
	sink := testkit.NewLogSink()
	in := New(ptr.Load, zerolog.New(sink))
	healthy := func(want bool, prefix string) {
		t.Helper()
		if ok, why := in.Healthy(); ok != want || !strings.HasPrefix(why, prefix) {
			t.Errorf("Healthy = %v, %q; want %v, %q…", ok, why, want, prefix)
		}
	}
	healthy(true, "ok")
	if !in.Drain("test") || in.Drain("again") {
		t.Error("Drain twice: want true, then false")
	}
	healthy(false, "draining since ")
	if st := in.Status(); !st.Draining || st.By != "test" || st.Since.IsZero() || st.Healthy {
		t.Errorf("Status while draining = %+v", st)
	}
	if !in.Undrain("test") || in.Undrain("again") {
		t.Error("Undrain twice: want true, then false")
	}
	healthy(true, "ok")
	ptr.Store(table(t, map[string][]string{"pg": {"a:down"}}))
	healthy(false, "no service has a backend up")

	in.Drain("before stop")
	in.Stop()
	in.Stop()
	if in.Undrain("after stop") {
		t.Error("Undrain after Stop changed the state")
	}
	healthy(false, "stopping")
	if st := in.Status(); !st.Stopping || !st.Draining || st.By != "before stop" {
		t.Errorf("Status after Stop = %+v", st)
	}
	for msg, want := range map[string]int{
		"instance draining: /healthz fails, connections are still served": 2,
		"instance undrained: /healthz follows the backends again":         1,
		"instance stopping: /healthz fails until exit":                    1,
		"instance is stopping; it stays drained":                          1,
	} {
		if n := len(sink.All(testkit.Message(msg))); n != want {
			t.Errorf("%d lines %q; want %d", n, msg, want)
		}
	}
}

// TestRunSignals: SIGUSR1 drains, SIGUSR2 undrains, the end of ctx stops.
func TestRunSignals(t *testing.T) {
	var ptr atomic.Pointer[sched.Table]
	ptr.Store(table(t, map[string][]string{"pg": {"a"}}))
	sink := testkit.NewLogSink()
	in := New(ptr.Load, zerolog.New(sink))
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal)
	done := make(chan struct{})
	go func() { in.Run(ctx, sig); close(done) }() // exits when cancel is called
	sig <- syscall.SIGUSR1
	sink.Wait(t, 5*time.Second, "draining", func(m map[string]any) bool { return m["by"] == "SIGUSR1" })
	sig <- syscall.SIGUSR2
	sink.Wait(t, 5*time.Second, "undrained", func(m map[string]any) bool { return m["by"] == "SIGUSR2" })
	cancel()
	<-done
	if st := in.Status(); !st.Stopping || st.By != "shutdown" {
		t.Errorf("after ctx ended: %+v; want stopping by shutdown", st)
	}
}
