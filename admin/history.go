package admin

import (
	"context"
	"math"
	"sync"
	"time"

	"fulcrum/backend"
	"fulcrum/listener"
	"fulcrum/sched"
	"fulcrum/status"
)

// History keeps, per backend, the last Len one-second samples of its open
// connections, new connections per second and last check latency: the
// console's small plots. It lives in memory only and is bounded: Len
// samples of three numbers for at most MaxSeries backends (the first in
// the table's order; 3.6 MiB at the defaults), and a backend gone for Len
// samples is forgotten. A sample reads each backend's counters and nothing
// else (not a whole status), so keeping the history costs little whether
// or not anyone looks. Run samples; the rest may be called from any
// goroutine.
type History struct {
	Len       int // samples kept; 0: DefaultHistory
	MaxSeries int // backends sampled; 0: DefaultHistorySeries

	mu     sync.Mutex // protects the fields below
	times  []int64    // unix milliseconds of each sample, a ring of Len
	next   int        // where the next sample goes
	filled int        // samples in the ring
	taken  uint64     // samples taken, the one being taken included
	series map[*backend.Backend]*series
}

// DefaultHistory is how many samples a History keeps: five minutes.
const DefaultHistory = 300

// DefaultHistorySeries is how many backends a History samples: more than
// one screen shows, and a bound for configurations of thousands.
const DefaultHistorySeries = 1000

// series is one backend's samples, aligned with History.times; NaN where
// the backend was not sampled.
type series struct {
	key                  string // "service/backend"
	conns, rate, latency []float32
	total                uint64 // its connections total at the last sample
	seen                 bool   // total is from the sample before
	at                   uint64 // the History.taken of its last sample
	absent               int    // samples in a row it was missing from
}

// Run samples the backends of src every interval until ctx ends: those of
// the running table (src.Snapshot) and those draining after their removal
// (src.Draining).
func (h *History) Run(ctx context.Context, interval time.Duration, src status.Source) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	h.Sample(src, last, 0)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.Sample(src, now, now.Sub(last))
			last = now
		}
	}
}

// Sample adds one sample of src's backends taken at now, dt after the
// previous one (0: the first, which has no rate).
func (h *History) Sample(src status.Source, now time.Time, dt time.Duration) {
	var snap *listener.Snapshot
	if src.Snapshot != nil {
		snap = src.Snapshot()
	}
	var drains []status.Drain
	if src.Draining != nil {
		drains = src.Draining()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.Len
	if n <= 0 {
		n = DefaultHistory
	}
	if h.times == nil {
		h.times = make([]int64, n)
		h.series = map[*backend.Backend]*series{}
	}
	i := h.next
	h.times[i] = now.UnixMilli()
	h.next = (i + 1) % n
	h.filled = min(h.filled+1, n)
	h.taken++
	if snap != nil {
		for _, s := range snap.Services {
			for _, ts := range [][]sched.Target{s.Targets, s.Backups} {
				for j := range ts {
					h.add(ts[j].B, i, n, dt)
				}
			}
		}
	}
	for _, d := range drains {
		h.add(d.B, i, n, dt)
	}
	nan := float32(math.NaN())
	for k, sr := range h.series {
		if sr.at == h.taken {
			continue
		}
		sr.conns[i], sr.rate[i], sr.latency[i] = nan, nan, nan
		sr.seen = false
		if sr.absent++; sr.absent >= n {
			delete(h.series, k)
		}
	}
}

// add records backend b in sample i of a ring of n, dt after the one
// before. Called with mu held.
func (h *History) add(b *backend.Backend, i, n int, dt time.Duration) {
	sr := h.series[b]
	if sr == nil {
		most := h.MaxSeries
		if most <= 0 {
			most = DefaultHistorySeries
		}
		if len(h.series) >= most {
			return
		}
		sr = &series{key: b.Service + "/" + b.Name, conns: nans(n), rate: nans(n), latency: nans(n)}
		h.series[b] = sr
	}
	if sr.at == h.taken { // listed twice (in the table, and draining at shutdown)
		return
	}
	st := b.Stats()
	nan := float32(math.NaN())
	sr.conns[i] = float32(st.Active)
	sr.rate[i] = nan
	if sr.seen && dt > 0 && st.Total >= sr.total {
		sr.rate[i] = float32(float64(st.Total-sr.total) / dt.Seconds())
	}
	sr.total, sr.seen, sr.at, sr.absent = st.Total, true, h.taken, 0
	sr.latency[i] = nan
	if c := b.Checks().Last; !c.At.IsZero() {
		sr.latency[i] = float32(float64(c.Latency.Microseconds()) / 1000)
	}
}

func nans(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	return s
}

// HistoryJSON is what GET /history serves: sample times (unix ms, oldest
// first) and, per "service/backend", one value per time (null where
// unknown).
type HistoryJSON struct {
	Times  []int64               `json:"times"`
	Series map[string]SeriesJSON `json:"series"`
}

// SeriesJSON is one backend's samples.
type SeriesJSON struct {
	Conns     []*float64 `json:"conns"`
	Rate      []*float64 `json:"rate"`
	LatencyMS []*float64 `json:"latency_ms"`
}

// JSON copies the samples kept, oldest first.
func (h *History) JSON() HistoryJSON {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := HistoryJSON{Times: []int64{}, Series: map[string]SeriesJSON{}}
	n := len(h.times)
	if n == 0 {
		return out
	}
	start := (h.next - h.filled + n) % n
	idx := make([]int, h.filled)
	for j := range idx {
		idx[j] = (start + j) % n
		out.Times = append(out.Times, h.times[idx[j]])
	}
	pick := func(v []float32) []*float64 {
		o := make([]*float64, len(idx))
		for j, i := range idx {
			if x := float64(v[i]); !math.IsNaN(x) {
				x = math.Round(x*1000) / 1000 // float32's noise off
				o[j] = &x
			}
		}
		return o
	}
	at := make(map[string]uint64, len(h.series))
	for _, sr := range h.series {
		if a, dup := at[sr.key]; dup && a > sr.at {
			continue // removed, and added again since as a new backend: the one sampled last
		}
		at[sr.key] = sr.at
		out.Series[sr.key] = SeriesJSON{Conns: pick(sr.conns), Rate: pick(sr.rate), LatencyMS: pick(sr.latency)}
	}
	return out
}
