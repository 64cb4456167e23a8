// Command report turns the raw samples of one bench/run.sh run into the
// Markdown table of figures and ratios that the script prints and records in
// bench/RESULTS.md.
//
//	report -samples FILE -targets 'direct=direct,haproxy=HAProxy 2.6,…' [-clk-tck 100]
//
// FILE has one sample per line, tab-separated: repetition, target, key,
// value (a number). The keys are those run.sh writes (bulk1_bps, conn_rate,
// idle_rss1_kib, …; see rows below). Every figure in the table is the median
// over repetitions of a figure computed within one repetition, so a ratio
// such as RSS per connection never mixes two runs. Ratios are a target's
// median over the base's median: the direct connection for the data rows,
// HAProxy for the per-proxy rows. Keys named error:KIND or ending in _failed
// are failures; they are summed and listed under the table.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("samples", "", "samples `file` (rep, target, key, value; tab-separated)")
	targets := fs.String("targets", "", "columns in order, as `id=label,…`; ids as in the samples")
	clkTck := fs.Float64("clk-tck", 100, "clock ticks per second of /proc/PID/stat (getconf CLK_TCK)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cols, err := parseTargets(*targets)
	if err != nil || *path == "" || *clkTck <= 0 {
		fmt.Fprintf(stderr, "report: need -samples, -targets id=label,… and a positive -clk-tck (%v)\n", err)
		return 2
	}
	f, err := os.Open(*path)
	if err != nil {
		fmt.Fprintf(stderr, "report: %v\n", err)
		return 1
	}
	defer f.Close()
	s, err := parseSamples(f)
	if err != nil {
		fmt.Fprintf(stderr, "report: %s: %v\n", *path, err)
		return 1
	}
	render(stdout, s, cols, *clkTck)
	return 0
}

// column is one target of the table.
type column struct{ id, label string }

func parseTargets(s string) ([]column, error) {
	var cols []column
	for _, f := range strings.Split(s, ",") {
		id, label, ok := strings.Cut(f, "=")
		if !ok || id == "" || label == "" {
			return nil, fmt.Errorf("target %q is not id=label", f)
		}
		cols = append(cols, column{id, label})
	}
	return cols, nil
}

// samples holds every value by repetition, then target, then key.
type samples struct {
	reps []string // in order of first appearance
	by   map[string]map[string]map[string]float64
}

func (s *samples) get(rep, target string) map[string]float64 { return s.by[rep][target] }

func parseSamples(r io.Reader) (*samples, error) {
	s := &samples{by: map[string]map[string]map[string]float64{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: want 4 tab-separated fields, got %d", n, len(f))
		}
		v, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rep, target, key := f[0], f[1], f[2]
		if s.by[rep] == nil {
			s.by[rep] = map[string]map[string]float64{}
			s.reps = append(s.reps, rep)
		}
		if s.by[rep][target] == nil {
			s.by[rep][target] = map[string]float64{}
		}
		s.by[rep][target][key] = v
	}
	return s, sc.Err()
}

// row is one line of the table: how to compute its figure from one
// repetition's samples of one target, and how to show it.
type row struct {
	label string
	base  string // target id the ratios are to
	lower bool   // lower is better
	value func(m map[string]float64, clkTck float64) (float64, bool)
	show  func(v float64, m map[string]float64) string
}

// key is a figure that is a sample as it is, scaled.
func key(k string, scale float64) func(map[string]float64, float64) (float64, bool) {
	return func(m map[string]float64, _ float64) (float64, bool) {
		v, ok := m[k]
		return v * scale, ok
	}
}

// per is a figure a/b of two samples (a scaled), defined when b > 0.
func per(a, b string, scale func(clkTck float64) float64) func(map[string]float64, float64) (float64, bool) {
	return func(m map[string]float64, clkTck float64) (float64, bool) {
		x, ok1 := m[a]
		y, ok2 := m[b]
		if !ok1 || !ok2 || y <= 0 {
			return 0, false
		}
		return x * scale(clkTck) / y, true
	}
}

// delta is (a1 − a0) ÷ b: growth per unit, such as KiB per connection held.
func delta(a0, a1, b string) func(map[string]float64, float64) (float64, bool) {
	return func(m map[string]float64, _ float64) (float64, bool) {
		x0, ok0 := m[a0]
		x1, ok1 := m[a1]
		y, ok2 := m[b]
		if !ok0 || !ok1 || !ok2 || y <= 0 {
			return 0, false
		}
		return (x1 - x0) / y, true
	}
}

var rows = []row{
	{label: "bulk, 1 stream (iperf3), Gbit/s", base: "direct", value: key("bulk1_bps", 1e-9), show: fixed(1)},
	{label: "bulk, 4 streams (iperf3 -P 4), Gbit/s", base: "direct", value: key("bulk4_bps", 1e-9), show: fixed(1)},
	{label: "new connections/s (connect, 64 B echo, close; 32 clients)", base: "direct", value: key("conn_rate", 1), show: count},
	{label: "64 B request/response, 1 connection, ops/s", base: "direct", value: key("pp1_rate", 1), show: count},
	{label: "… 1 connection, p50 µs ↓", base: "direct", lower: true, value: key("pp1_p50_us", 1), show: micros},
	{label: "… 1 connection, p99 µs ↓", base: "direct", lower: true, value: key("pp1_p99_us", 1), show: micros},
	{label: "… 1 connection, p99.9 µs ↓", base: "direct", lower: true, value: key("pp1_p999_us", 1), show: micros},
	{label: "64 B request/response, 32 persistent connections, ops/s", base: "direct", value: key("pp32_rate", 1), show: count},
	{label: "… 32 connections, p50 µs ↓", base: "direct", lower: true, value: key("pp32_p50_us", 1), show: micros},
	{label: "… 32 connections, p99 µs ↓", base: "direct", lower: true, value: key("pp32_p99_us", 1), show: micros},
	{label: "… 32 connections, p99.9 µs ↓", base: "direct", lower: true, value: key("pp32_p999_us", 1), show: micros},
	{label: "64 B open loop, 32 connections at 50% of the best peer's pp32 rate: achieved ops/s", base: "direct", value: key("open50_rate", 1), show: count},
	{label: "… 50%, p50 µs ↓ (from each message's due time)", base: "direct", lower: true, value: key("open50_p50_us", 1), show: micros},
	{label: "… 50%, p99 µs ↓", base: "direct", lower: true, value: key("open50_p99_us", 1), show: micros},
	{label: "… 50%, p99.9 µs ↓", base: "direct", lower: true, value: key("open50_p999_us", 1), show: micros},
	{label: "64 B open loop at 80%: achieved ops/s", base: "direct", value: key("open80_rate", 1), show: count},
	{label: "… 80%, p50 µs ↓", base: "direct", lower: true, value: key("open80_p50_us", 1), show: micros},
	{label: "… 80%, p99 µs ↓", base: "direct", lower: true, value: key("open80_p99_us", 1), show: micros},
	{label: "… 80%, p99.9 µs ↓", base: "direct", lower: true, value: key("open80_p999_us", 1), show: micros},
	{label: "idle connections held (alive at the end, of those asked)", base: "haproxy", value: key("idle_alive", 1), show: ofAsked},
	{label: "proxy descriptors per idle connection ↓", base: "haproxy", lower: true, value: delta("idle_fds0", "idle_fds1", "idle_alive"), show: fixed(2)},
	{label: "proxy RSS per idle connection, KiB ↓", base: "haproxy", lower: true, value: delta("idle_rss0_kib", "idle_rss1_kib", "idle_alive"), show: fixed(1)},
	{label: "proxy CPU per new connection, µs ↓", base: "haproxy", lower: true,
		value: per("conn_cpu_ticks", "conn_total", func(hz float64) float64 { return 1e6 / hz }), show: fixed(1)},
	{label: "proxy CPU per GB, bulk 4 streams, ms ↓", base: "haproxy", lower: true,
		value: per("bulk4_cpu_ticks", "bulk4_bytes", func(hz float64) float64 { return 1e3 * 1e9 / hz }), show: count},
	{label: "`pgbench -S`, 16 persistent clients, tps", base: "direct", value: key("pg_tps", 1), show: count},
	{label: "… proxy CPU per transaction, µs ↓", base: "haproxy", lower: true, value: per("pg_cpu_ticks", "pg_ops", perMicro), show: fixed(1)},
	{label: "`redis-benchmark -t get -c 50`, req/s", base: "direct", value: key("rget_rps", 1), show: count},
	{label: "… proxy CPU per request, µs ↓", base: "haproxy", lower: true, value: per("rget_cpu_ticks", "rget_ops", perMicro), show: fixed(1)},
	{label: "`redis-benchmark -t get -c 50 -P 32 -d 1024`, req/s", base: "direct", value: key("rpipe_rps", 1), show: count},
	{label: "… proxy CPU per request, µs ↓", base: "haproxy", lower: true, value: per("rpipe_cpu_ticks", "rpipe_ops", perMicro), show: fixed(2)},
	{label: "`redis-benchmark -t get -c 50 -k 0` (a connection per request), req/s", base: "direct", value: key("rnew_rps", 1), show: count},
	{label: "… proxy CPU per connection and request, µs ↓", base: "haproxy", lower: true, value: per("rnew_cpu_ticks", "rnew_ops", perMicro), show: fixed(1)},
}

// perMicro scales clock ticks to microseconds.
func perMicro(hz float64) float64 { return 1e6 / hz }

func fixed(decimals int) func(float64, map[string]float64) string {
	return func(v float64, _ map[string]float64) string { return strconv.FormatFloat(v, 'f', decimals, 64) }
}

// count shows a whole number with thousands separators: 58,824.
func count(v float64, _ map[string]float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func micros(v float64, m map[string]float64) string {
	if v < 100 {
		return fixed(1)(v, m)
	}
	return count(v, m)
}

func ofAsked(v float64, m map[string]float64) string {
	if a, ok := m["idle_asked"]; ok {
		return count(v, m) + " of " + count(a, m)
	}
	return count(v, m)
}

// cell is one target's figure in one row.
type cell struct {
	v    float64
	n    int                // repetitions that gave a figure
	last map[string]float64 // the samples of a repetition, for show
}

func (r *row) cell(s *samples, target string, clkTck float64) cell {
	var vs []float64
	var last map[string]float64
	for _, rep := range s.reps {
		m := s.get(rep, target)
		if v, ok := r.value(m, clkTck); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			vs = append(vs, v)
			last = m
		}
	}
	return cell{v: median(vs), n: len(vs), last: last}
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// render writes the table, then its footnotes.
func render(w io.Writer, s *samples, cols []column, clkTck float64) {
	has := func(id string) bool { return slices.ContainsFunc(cols, func(c column) bool { return c.id == id }) }
	var peers []string // the C balancers fulcrum is held to
	for _, id := range []string{"haproxy", "nginx"} {
		if has(id) {
			peers = append(peers, id)
		}
	}
	ratio := has("fulcrum") && len(peers) > 0
	fmt.Fprint(w, "| workload |")
	for _, c := range cols {
		fmt.Fprintf(w, " %s |", c.label)
	}
	if ratio {
		fmt.Fprint(w, " fulcrum ÷ best peer |")
	}
	fmt.Fprint(w, "\n|---|")
	for range cols {
		fmt.Fprint(w, "---:|")
	}
	if ratio {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	short := false
	for i := range rows {
		r := &rows[i]
		base := r.cell(s, r.base, clkTck)
		fmt.Fprintf(w, "| %s |", r.label)
		for _, c := range cols {
			x := r.cell(s, c.id, clkTck)
			switch {
			case x.n == 0:
				fmt.Fprint(w, " — |")
				continue
			case base.n > 0 && base.v != 0:
				fmt.Fprintf(w, " %s (%.2f)", r.show(x.v, x.last), x.v/base.v)
			default:
				fmt.Fprintf(w, " %s", r.show(x.v, x.last))
			}
			if x.n < len(s.reps) {
				fmt.Fprintf(w, " †%d", x.n)
				short = true
			}
			fmt.Fprint(w, " |")
		}
		if ratio {
			f := r.cell(s, "fulcrum", clkTck)
			best := math.NaN()
			for _, id := range peers {
				if p := r.cell(s, id, clkTck); p.n > 0 && (math.IsNaN(best) || r.lower == (p.v < best)) {
					best = p.v
				}
			}
			if f.n > 0 && !math.IsNaN(best) && best != 0 {
				fmt.Fprintf(w, " %.2f |", f.v/best)
			} else {
				fmt.Fprint(w, " — |")
			}
		}
		fmt.Fprintln(w)
	}
	var bases []string
	for _, b := range []struct{ id, rows string }{{"direct", "data rows"}, {"haproxy", "per-proxy rows"}} {
		if l, ok := labelOf(cols, b.id); ok {
			bases = append(bases, fmt.Sprintf("to %s for the %s", l, b.rows))
		}
	}
	fmt.Fprintf(w, "\nEach figure is the median of %d repetition%s", len(s.reps), plural(len(s.reps)))
	if len(bases) > 0 {
		fmt.Fprintf(w, "; in brackets its ratio %s", strings.Join(bases, ", "))
	}
	fmt.Fprint(w, ". ↓: lower is better.")
	if ratio {
		fmt.Fprintf(w, " The last column is fulcrum's median over the best median of %s on the row.", strings.Join(peers, " and "))
	}
	fmt.Fprintln(w)
	if short {
		fmt.Fprintln(w, "†N: only N repetitions gave this figure (the others failed; see below).")
	}
	renderScale(w, s, cols, clkTck)
	if notes := failures(s, cols); len(notes) > 0 {
		fmt.Fprintln(w, "\nFailures counted (summed over repetitions):")
		for _, n := range notes {
			fmt.Fprintln(w, "- "+n)
		}
	}
}

func labelOf(cols []column, id string) (string, bool) {
	for _, c := range cols {
		if c.id == id {
			return c.label, true
		}
	}
	return "", false
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// failures sums the error:KIND and *_failed samples of each target and
// workload: "fulcrum, idle: 5,659 (dial: timeout 5,600; read: eof 59)".
func failures(s *samples, cols []column) []string {
	var out []string
	for _, c := range cols {
		byWork := map[string]map[string]float64{}
		for _, rep := range s.reps {
			for k, v := range s.get(rep, c.id) {
				work, kind, ok := failureKey(k)
				if !ok || v == 0 {
					continue
				}
				if byWork[work] == nil {
					byWork[work] = map[string]float64{}
				}
				byWork[work][kind] += v
			}
		}
		works := make([]string, 0, len(byWork))
		for w := range byWork {
			works = append(works, w)
		}
		slices.Sort(works)
		for _, work := range works {
			kinds := make([]string, 0, len(byWork[work]))
			total := 0.0
			for k, v := range byWork[work] {
				kinds = append(kinds, k)
				total += v
			}
			slices.Sort(kinds)
			parts := make([]string, len(kinds))
			for i, k := range kinds {
				parts[i] = k + " " + count(byWork[work][k], nil)
			}
			out = append(out, fmt.Sprintf("%s, %s: %s (%s)", c.label, work, count(total, nil), strings.Join(parts, "; ")))
		}
	}
	return out
}

// failureKey splits "idle_error:dial: refused" into ("idle", "dial: refused")
// and "bulk1_failed" into ("bulk1", "failed").
func failureKey(k string) (work, kind string, ok bool) {
	if w, kind, ok := strings.Cut(k, "_error:"); ok {
		return w, kind, true
	}
	if w, ok := strings.CutSuffix(k, "_failed"); ok {
		return w, "run failed", true
	}
	return "", "", false
}

// The scale run's parts (run.sh's scale workload): its sample keys' prefixes
// and their column headings.
var scaleParts = []struct{ key, heading string }{
	{"scale3", "3 backends"}, {"scale1000", "1,000 backends"}, {"scale10000", "10,000 backends"}, {"scaleidle", "3 backends, idle held"},
}

// scaleRows are the figures of each part: the key's suffix after the part.
var scaleRows = []row{
	{label: "CPU per new connection, µs ↓", lower: true, show: fixed(1)},
	{label: "connection latency (connect, 64 B echo, close), p50 µs ↓", lower: true, show: micros},
	{label: "… p99 µs ↓", lower: true, show: micros},
	{label: "new connections/s", show: count},
}

// scaleValue is row i's figure of part k in one repetition's samples.
func scaleValue(i int, k string) func(map[string]float64, float64) (float64, bool) {
	switch i {
	case 0:
		return per(k+"_cpu_ticks", k+"_total", perMicro)
	case 1:
		return key(k+"_p50_us", 1)
	case 2:
		return key(k+"_p99_us", 1)
	}
	return key(k+"_rate", 1)
}

// renderScale writes, for each fulcrum column with scale samples, the cost
// as the work grows: each figure by part, and the largest over the
// smallest of the row (the target is flat: at most 1.1).
func renderScale(w io.Writer, s *samples, cols []column, clkTck float64) {
	for _, c := range cols {
		has := false
		for _, rep := range s.reps {
			if _, ok := s.get(rep, c.id)["scale3_total"]; ok {
				has = true
			}
		}
		if !has {
			continue
		}
		held := ""
		for _, rep := range s.reps {
			if v, ok := s.get(rep, c.id)["scaleidle_held"]; ok {
				held = count(v, nil)
			}
		}
		fmt.Fprintf(w, "\n%s, the cost as the work grows (32 clients connecting; one service, default scheduler):\n\n| figure |", c.label)
		for _, p := range scaleParts {
			h := p.heading
			if p.key == "scaleidle" && held != "" {
				h = "3 backends, " + held + " idle held"
			}
			fmt.Fprintf(w, " %s |", h)
		}
		fmt.Fprint(w, " largest ÷ smallest |\n|---|")
		for range scaleParts {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w, "---:|")
		for i, r := range scaleRows {
			fmt.Fprintf(w, "| %s |", r.label)
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, p := range scaleParts {
				rr := row{value: scaleValue(i, p.key)}
				x := rr.cell(s, c.id, clkTck)
				if x.n == 0 {
					fmt.Fprint(w, " — |")
					continue
				}
				fmt.Fprintf(w, " %s |", r.show(x.v, x.last))
				lo, hi = min(lo, x.v), max(hi, x.v)
			}
			if lo > 0 && !math.IsInf(lo, 0) && !math.IsInf(hi, 0) {
				fmt.Fprintf(w, " %.2f |\n", hi/lo)
			} else {
				fmt.Fprintln(w, " — |")
			}
		}
	}
}
