package admin

import (
	"fmt"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/sched"
	"fulcrum/status"
)

// BenchmarkHistorySample: what one second of the console's history costs
// with 1,000 backends (10 services of 100) and a full events ring: a
// sample read from the backends' counters, against the whole status the
// sampler used to build for it (status.Of, as /status serves).
func BenchmarkHistorySample(b *testing.B) {
	var pool backend.Pool
	var services []*sched.Service
	for i := range 10 {
		s := &sched.Service{Name: fmt.Sprintf("s%d", i), Scheduler: "rr"}
		for j := range 100 {
			s.Targets = append(s.Targets, sched.Target{B: pool.Get(s.Name, fmt.Sprintf("b%d", j)), Weight: 1, Base: 1})
		}
		services = append(services, s)
	}
	for i := range 256 {
		pool.Events.Add(backend.Event{At: time.Now(), Service: "s0", Backend: "b0", From: "up", To: "down", Reason: fmt.Sprint("check failed ", i)})
	}
	src := status.Source{Snapshot: snapOf(sched.NewTable(1, services, nil)), Events: pool.Events.List, Watcher: &status.Watcher{}}
	b.Run("sample", func(b *testing.B) {
		h := &History{}
		now := time.Now()
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Second)
			h.Sample(src, now, time.Second)
		}
	})
	b.Run("status.Of", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			status.Of(src)
		}
	})
}
