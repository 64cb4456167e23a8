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
	sys  string // of one pass (split): the label of its syscall repetition, "" if none
}

// The passes of a run (run.sh's PIN): repetitions are labelled 1, 2, … in
// the pinned pass and u1, u2, … in the unpinned one; s and us are the
// syscall repetitions of each, which no median includes.
const (
	pinnedSys   = "s"
	unpinnedSys = "us"
)

// split returns the pinned and the unpinned pass of s, each with its own
// repetitions and syscall repetition (nil: the pass did not run).
func (s *samples) split() (pinned, unpinned *samples) {
	p := &samples{by: s.by}
	u := &samples{by: s.by}
	for _, rep := range s.reps {
		switch {
		case rep == pinnedSys:
			p.sys = rep
		case rep == unpinnedSys:
			u.sys = rep
		case strings.HasPrefix(rep, "u"):
			u.reps = append(u.reps, rep)
		default:
			p.reps = append(p.reps, rep)
		}
	}
	if len(p.reps) == 0 && p.sys == "" {
		p = nil
	}
	if len(u.reps) == 0 && u.sys == "" {
		u = nil
	}
	return p, u
}

// cpus is the number of CPUs the pass's proxies could use, 0 if unknown.
func (s *samples) cpus() float64 {
	for _, rep := range s.reps {
		for _, m := range s.by[rep] {
			if v, ok := m["proxy_cpus"]; ok {
				return v
			}
		}
	}
	return 0
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
	// sys: the figure comes from the syscall repetition alone (samples.sys),
	// not a median over the others.
	sys bool
	// noRatio: no ratio to a base nor to the best peer (a share of the CPUs
	// is no better for being smaller).
	noRatio bool
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

// The rows of the table, workload by workload: what the client measured,
// then what the proxy spent on it: CPU per operation, how busy its CPUs were
// over the run (a core at 95% or more is saturated: the rate is then the
// proxy's), and, from the syscall repetition, system calls per operation.
var rows = concat(
	[]row{
		{label: "bulk, 1 stream (iperf3), Gbit/s", base: "direct", value: key("bulk1_bps", 1e-9), show: fixed(1)},
		{label: "… proxy CPU per GB, ms ↓", base: "haproxy", lower: true, value: per("bulk1_cpu_ticks", "bulk1_bytes", perGB), show: count},
	},
	proxyRows("bulk1", "bulk1_bytes", "per MB", 1e6),
	[]row{
		{label: "bulk, 4 streams (iperf3 -P 4), Gbit/s", base: "direct", value: key("bulk4_bps", 1e-9), show: fixed(1)},
		{label: "… proxy CPU per GB, ms ↓", base: "haproxy", lower: true, value: per("bulk4_cpu_ticks", "bulk4_bytes", perGB), show: count},
	},
	proxyRows("bulk4", "bulk4_bytes", "per MB", 1e6),
	[]row{
		{label: "new connections/s (connect, 64 B echo, close; 32 clients)", base: "direct", value: key("conn_rate", 1), show: count},
		{label: "… proxy CPU per new connection, µs ↓", base: "haproxy", lower: true, value: per("conn_cpu_ticks", "conn_total", perMicro), show: fixed(1)},
	},
	proxyRows("conn", "conn_total", "per connection", 1),
	[]row{
		{label: "64 B request/response, 1 connection, ops/s", base: "direct", value: key("pp1_rate", 1), show: count},
		{label: "… 1 connection, p50 µs ↓", base: "direct", lower: true, value: key("pp1_p50_us", 1), show: micros},
		{label: "… 1 connection, p99 µs ↓", base: "direct", lower: true, value: key("pp1_p99_us", 1), show: micros},
		{label: "… 1 connection, p99.9 µs ↓", base: "direct", lower: true, value: key("pp1_p999_us", 1), show: micros},
		{label: "… proxy CPU per round trip, µs ↓", base: "haproxy", lower: true, value: per("pp1_cpu_ticks", "pp1_total", perMicro), show: fixed(1)},
	},
	proxyRows("pp1", "pp1_total", "per round trip", 1),
	[]row{
		{label: "64 B request/response, 32 persistent connections, ops/s", base: "direct", value: key("pp32_rate", 1), show: count},
		{label: "… 32 connections, p50 µs ↓", base: "direct", lower: true, value: key("pp32_p50_us", 1), show: micros},
		{label: "… 32 connections, p99 µs ↓", base: "direct", lower: true, value: key("pp32_p99_us", 1), show: micros},
		{label: "… 32 connections, p99.9 µs ↓", base: "direct", lower: true, value: key("pp32_p999_us", 1), show: micros},
		{label: "… proxy CPU per round trip, µs ↓", base: "haproxy", lower: true, value: per("pp32_cpu_ticks", "pp32_total", perMicro), show: fixed(1)},
	},
	proxyRows("pp32", "pp32_total", "per round trip", 1),
	[]row{
		{label: "64 B open loop, 32 connections at 50% of the best peer's pp32 rate: achieved ops/s", base: "direct", value: key("open50_rate", 1), show: count},
		{label: "… 50%, p50 µs ↓ (from each message's due time)", base: "direct", lower: true, value: key("open50_p50_us", 1), show: micros},
		{label: "… 50%, p99 µs ↓", base: "direct", lower: true, value: key("open50_p99_us", 1), show: micros},
		{label: "… 50%, p99.9 µs ↓", base: "direct", lower: true, value: key("open50_p999_us", 1), show: micros},
		{label: "… proxy CPU per message, µs ↓", base: "haproxy", lower: true, value: per("open50_cpu_ticks", "open50_total", perMicro), show: fixed(1)},
	},
	proxyRows("open50", "open50_total", "per message", 1),
	[]row{
		{label: "64 B open loop at 80%: achieved ops/s", base: "direct", value: key("open80_rate", 1), show: count},
		{label: "… 80%, p50 µs ↓", base: "direct", lower: true, value: key("open80_p50_us", 1), show: micros},
		{label: "… 80%, p99 µs ↓", base: "direct", lower: true, value: key("open80_p99_us", 1), show: micros},
		{label: "… 80%, p99.9 µs ↓", base: "direct", lower: true, value: key("open80_p999_us", 1), show: micros},
		{label: "… proxy CPU per message, µs ↓", base: "haproxy", lower: true, value: per("open80_cpu_ticks", "open80_total", perMicro), show: fixed(1)},
	},
	proxyRows("open80", "open80_total", "per message", 1),
	[]row{
		{label: "idle connections held (alive at the end, of those asked)", base: "haproxy", value: key("idle_alive", 1), show: ofAsked},
		{label: "proxy descriptors per idle connection ↓", base: "haproxy", lower: true, value: delta("idle_fds0", "idle_fds1", "idle_alive"), show: fixed(2)},
		{label: "proxy RSS per idle connection, KiB ↓", base: "haproxy", lower: true, value: delta("idle_rss0_kib", "idle_rss1_kib", "idle_alive"), show: fixed(1)},
	},
	dbRows("pg", "`pgbench -S`, 16 persistent clients, tps", "transaction", "tps"),
	dbRows("pgprep", "`pgbench -S -M prepared` (extended protocol), 32 clients, tps", "transaction", "tps"),
	dbRows("pgrows", "`pgbench -M prepared`, 100 rows a query (about 12 KB), 100 clients, tps", "transaction", "tps"),
	dbRows("maria", "MariaDB `sysbench oltp_read_only`, 16 threads, transactions/s", "transaction", "tps"),
	dbRows("rget", "`redis-benchmark -t get -c 50`, req/s", "request", "rps"),
	dbRows("rpipe", "`redis-benchmark -t get -c 50 -P 32 -d 1024`, req/s", "request", "rps"),
	dbRows("rnew", "`redis-benchmark -t get -c 50 -k 0` (a connection per request), req/s", "connection and request", "rps"),
	dbRows("rlist", "`redis-benchmark -c 100 lrange` of 100 × 64 B (about 7 KB a reply), req/s", "request", "rps"),
	dbRows("rhash", "`redis-benchmark -c 100 hgetall` of 32 × 64 B (about 2.5 KB a reply), req/s", "request", "rps"),
)

func concat(rs ...[]row) []row { return slices.Concat(rs...) }

// dbRows are a real client's rows: its rate (KEY_RATE), the proxy's CPU per
// operation (KEY_ops of them), how busy its CPUs were, its syscalls per op.
func dbRows(k, label, op, rate string) []row {
	digits := 1
	if k == "rpipe" {
		digits = 2
	}
	return append([]row{
		{label: label, base: "direct", value: key(k+"_"+rate, 1), show: count},
		{label: "… proxy CPU per " + op + ", µs ↓", base: "haproxy", lower: true, value: per(k+"_cpu_ticks", k+"_ops", perMicro), show: fixed(digits)},
	}, proxyRows(k, k+"_ops", "per "+op, 1)...)
}

// proxyRows are the rows every measured run has besides its CPU per op: how
// busy the proxy's CPUs were (KEY_cpu_ticks over KEY_wall_us and the
// proxy_cpus it may use), how busy the load's CPUs were (KEY_load_busy, by
// any process: where they are saturated and the proxy's are not, the rate
// is the load's), and the syscalls per op (of OPS ÷ unit, from the
// syscall repetition), with the epoll waits among them after the slash.
func proxyRows(k, ops, per string, unit float64) []row {
	return []row{
		{label: "… proxy CPUs busy, %: the proxy's / anyone's (≥ 95 the proxy's: saturated)", noRatio: true, value: busy(k), show: withAnyone(k + "_pcpu_busy")},
		{label: "… load CPUs busy, % (pinned: the clients' and servers'; unpinned: all, the proxy's too)", noRatio: true, value: key(k+"_load_busy", 1), show: fixed(0)},
		{label: "… proxy syscalls " + per + " / of them epoll waits ↓", base: "haproxy", lower: true, sys: true,
			value: syscalls(k+"_sys", ops, unit), show: withWaits(k+"_sysw", ops, unit)},
	}
}

// withAnyone shows the proxy's share of its CPUs, then the share any process
// had of them in the last repetition that has one (KEY_pcpu_busy, from /proc/stat): "14 /
// 100" is a proxy that had 14% of CPUs kept busy by others too, a run on a
// machine that was not quiet.
func withAnyone(anyone string) func(float64, map[string]float64) string {
	return func(v float64, m map[string]float64) string {
		s := strconv.FormatFloat(v, 'f', 0, 64)
		if a, ok := m[anyone]; ok {
			s += " / " + strconv.FormatFloat(a, 'f', 0, 64)
		}
		return s
	}
}

// perGB scales clock ticks per byte to milliseconds per GB.
func perGB(hz float64) float64 { return 1e3 * 1e9 / hz }

// busy is the share of its CPUs the proxy used over run k, in percent.
func busy(k string) func(map[string]float64, float64) (float64, bool) {
	return func(m map[string]float64, clkTck float64) (float64, bool) {
		ticks, ok1 := m[k+"_cpu_ticks"]
		wall, ok2 := m[k+"_wall_us"]
		cpus, ok3 := m["proxy_cpus"]
		if !ok1 || !ok2 || !ok3 || wall <= 0 || cpus <= 0 {
			return 0, false
		}
		return 100 * (ticks / clkTck) / (wall / 1e6) / cpus, true
	}
}

// syscalls is sys ÷ (ops ÷ unit): system calls per operation (or per MB).
func syscalls(sys, ops string, unit float64) func(map[string]float64, float64) (float64, bool) {
	return func(m map[string]float64, _ float64) (float64, bool) {
		n, ok1 := m[sys]
		o, ok2 := m[ops]
		if !ok1 || !ok2 || o <= 0 {
			return 0, false
		}
		return n * unit / o, true
	}
}

// withWaits shows syscalls per op, then the epoll waits per op of the same
// repetition: "9.7 / 3.0".
func withWaits(waits, ops string, unit float64) func(float64, map[string]float64) string {
	return func(v float64, m map[string]float64) string {
		s := strconv.FormatFloat(v, 'f', 1, 64)
		if w, ok := syscalls(waits, ops, unit)(m, 0); ok {
			s += " / " + strconv.FormatFloat(w, 'f', 1, 64)
		}
		return s
	}
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
	reps := s.reps
	if r.sys {
		reps = nil
		if s.sys != "" {
			reps = []string{s.sys}
		}
	}
	for _, rep := range reps {
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

// render writes a table for each pass of the run: the pinned one (the one
// the targets are read from) first.
func render(w io.Writer, s *samples, cols []column, clkTck float64) {
	pinned, unpinned := s.split()
	for i, p := range []*samples{pinned, unpinned} {
		if p == nil {
			continue
		}
		if i == 0 {
			fmt.Fprintf(w, "**Pinned**: each proxy alone on %s with a thread (fulcrum: an event loop) per CPU; every client, backend and server on the other CPUs. The targets are read from this table.\n\n", cpuWords(p.cpus()))
		} else {
			if pinned != nil {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "**Unpinned**: proxies, clients, backends and servers share all %s.\n\n", cpuWords(p.cpus()))
		}
		renderTable(w, p, cols, clkTck)
	}
}

// cpuWords: "1 CPU", "2 CPUs", "its CPUs" when unknown.
func cpuWords(n float64) string {
	switch {
	case n == 1:
		return "1 CPU"
	case n > 1:
		return count(n, nil) + " CPUs"
	}
	return "its CPUs"
}

// renderTable writes the table of one pass, then its footnotes.
func renderTable(w io.Writer, s *samples, cols []column, clkTck float64) {
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
		if !slices.ContainsFunc(cols, func(c column) bool { return r.cell(s, c.id, clkTck).n > 0 }) {
			continue // a workload that did not run, or a figure no target has
		}
		base := r.cell(s, r.base, clkTck)
		fmt.Fprintf(w, "| %s |", r.label)
		for _, c := range cols {
			x := r.cell(s, c.id, clkTck)
			switch {
			case x.n == 0:
				fmt.Fprint(w, " — |")
				continue
			case !r.noRatio && base.n > 0 && base.v != 0:
				fmt.Fprintf(w, " %s (%.2f)", r.show(x.v, x.last), x.v/base.v)
			default:
				fmt.Fprintf(w, " %s", r.show(x.v, x.last))
			}
			if !r.sys && x.n < len(s.reps) {
				fmt.Fprintf(w, " †%d", x.n)
				short = true
			}
			fmt.Fprint(w, " |")
		}
		if ratio && r.noRatio {
			fmt.Fprint(w, " |")
		} else if ratio {
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
	if s.sys != "" {
		fmt.Fprint(w, " The syscall rows are from one more repetition with the proxy's system calls counted, in no median.")
	}
	if ratio {
		fmt.Fprintf(w, " The last column is fulcrum's median over the best median of %s on the row.", strings.Join(peers, " and "))
	}
	fmt.Fprintln(w)
	if short {
		fmt.Fprintln(w, "†N: only N repetitions gave this figure (the others failed; see below).")
	}
	renderScale(w, s, cols, clkTck)
	renderPaired(w, s, cols, clkTck)
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
		reps := s.reps
		if s.sys != "" {
			reps = append(slices.Clone(reps), s.sys) // the syscall repetition's failures count too
		}
		for _, rep := range reps {
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

// renderPaired compares other with fulcrum repetition by repetition, when
// both ran: an A/B of two builds. run.sh runs them back to back within each
// repetition, so a repetition's two figures share whatever the machine was
// doing then, and their ratio cancels much of it: on the 2-vCPU VM of issue
// 26 one build's CPU per operation moved up to 2 × between repetitions,
// which drowned a 5–8 % difference in the medians, while the ratio within
// each repetition showed it in 6 or 7 of 7. For each figure: the median of
// the ratios, in how many repetitions other was better (lower where lower
// is better), the ratios' range, and the two-sided sign test's p, the
// chance of so lopsided a count if neither build were better.
func renderPaired(w io.Writer, s *samples, cols []column, clkTck float64) {
	a, okA := labelOf(cols, "other")
	b, okB := labelOf(cols, "fulcrum")
	if !okA || !okB || len(s.reps) < 2 {
		return
	}
	type line struct {
		label          string
		med, lo, hi, p float64
		better, n      int
	}
	var lines []line
	for i := range rows {
		r := &rows[i]
		if r.noRatio || r.sys {
			continue
		}
		var qs []float64
		better := 0
		for _, rep := range s.reps {
			x, ok1 := r.value(s.get(rep, "other"), clkTck)
			y, ok2 := r.value(s.get(rep, "fulcrum"), clkTck)
			if !ok1 || !ok2 || y == 0 || math.IsNaN(x/y) || math.IsInf(x/y, 0) {
				continue
			}
			q := x / y
			qs = append(qs, q)
			if r.lower == (q < 1) && q != 1 {
				better++
			}
		}
		if len(qs) < 2 {
			continue
		}
		lines = append(lines, line{label: r.label, med: median(qs), lo: slices.Min(qs), hi: slices.Max(qs),
			better: better, n: len(qs), p: signTest(better, len(qs))})
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "\nPaired, %s against %s, repetition by repetition (%s ÷ %s within each repetition):\n\n", a, b, a, b)
	fmt.Fprintf(w, "| figure | median ratio | %s better in | range | sign test p |\n|---|---:|---:|---:|---:|\n", a)
	for _, l := range lines {
		fmt.Fprintf(w, "| %s | %.3f | %d of %d | %.2f–%.2f | %.2f |\n", l.label, l.med, l.better, l.n, l.lo, l.hi, l.p)
	}
}

// signTest is the two-sided sign test's p for k successes in n trials of
// even odds: twice the smaller tail, at most 1.
func signTest(k, n int) float64 {
	tail := func(k int) float64 { // P(X ≤ k)
		sum, c := 0.0, 1.0 // c = C(n, i)
		for i := 0; i <= k; i++ {
			sum += c
			c = c * float64(n-i) / float64(i+1)
		}
		return sum / math.Pow(2, float64(n))
	}
	return min(1, 2*min(tail(k), tail(n-k)))
}
