package admin

import (
	"context"
	"math"
	"sync"
	"time"

	"fulcrum/status"
)

// History keeps, per backend, the last Len one-second samples of its open
// connections, new connections per second and last check latency: the
// console's small plots. It lives in memory only and is bounded: Len
// samples of three numbers for at most MaxSeries backends (the first in
// the status's order; 3.6 MiB at the defaults), and a backend gone for Len
// samples is forgotten. Run samples; the rest may be called from any
// goroutine.
type History struct {
	Len       int // samples kept; 0: DefaultHistory
	MaxSeries int // backends sampled; 0: DefaultHistorySeries

	mu     sync.Mutex // protects the fields below
	times  []int64    // unix milliseconds of each sample, a ring of Len
	next   int        // where the next sample goes
	filled int        // samples in the ring
	series map[string]*series
}

// DefaultHistory is how many samples a History keeps: five minutes.
const DefaultHistory = 300

// DefaultHistorySeries is how many backends a History samples: more than
// one screen shows, and a bound for configurations of thousands.
const DefaultHistorySeries = 1000

// series is one backend's samples, aligned with History.times; NaN where
// the backend was not in the status.
type series struct {
	conns, rate, latency []float32
	total                uint64 // its connections total at the last sample
	seen                 bool   // total is from the sample before
	absent               int    // samples in a row it was missing from
}

// Run samples read() every interval until ctx ends.
func (h *History) Run(ctx context.Context, interval time.Duration, read func() status.Status) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	h.Sample(read(), last, 0)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.Sample(read(), now, now.Sub(last))
			last = now
		}
	}
}

// Sample adds one sample of st taken at now, dt after the previous one
// (0: the first, which has no rate).
func (h *History) Sample(st status.Status, now time.Time, dt time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.Len
	if n <= 0 {
		n = DefaultHistory
	}
	if h.times == nil {
		h.times = make([]int64, n)
		h.series = map[string]*series{}
	}
	i := h.next
	h.times[i] = now.UnixMilli()
	h.next = (i + 1) % n
	h.filled = min(h.filled+1, n)
	most := h.MaxSeries
	if most <= 0 {
		most = DefaultHistorySeries
	}
	nan := float32(math.NaN())
	present := map[string]bool{}
	for _, s := range st.Services {
		for _, b := range s.Backends {
			k := s.Name + "/" + b.Name
			sr := h.series[k]
			if sr == nil {
				if len(h.series) >= most {
					continue
				}
				sr = &series{conns: nans(n), rate: nans(n), latency: nans(n)}
				h.series[k] = sr
			}
			present[k] = true
			sr.conns[i] = float32(b.Active)
			sr.rate[i] = nan
			if sr.seen && dt > 0 && b.Total >= sr.total {
				sr.rate[i] = float32(float64(b.Total-sr.total) / dt.Seconds())
			}
			sr.total, sr.seen, sr.absent = b.Total, true, 0
			sr.latency[i] = nan
			if b.LastCheck != nil {
				sr.latency[i] = float32(b.LastCheck.LatencyMS)
			}
		}
	}
	for k, sr := range h.series {
		if present[k] {
			continue
		}
		sr.conns[i], sr.rate[i], sr.latency[i] = nan, nan, nan
		sr.seen = false
		if sr.absent++; sr.absent >= n {
			delete(h.series, k)
		}
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
	for k, sr := range h.series {
		out.Series[k] = SeriesJSON{Conns: pick(sr.conns), Rate: pick(sr.rate), LatencyMS: pick(sr.latency)}
	}
	return out
}
