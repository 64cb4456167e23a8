package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const sampleTSV = `1	direct	bulk1_bps	36e9
1	haproxy	bulk1_bps	13.5e9
1	fulcrum	bulk1_bps	18e9
2	direct	bulk1_bps	34e9
2	haproxy	bulk1_bps	14.5e9
2	fulcrum	bulk1_bps	17e9
3	direct	bulk1_bps	35e9
3	haproxy	bulk1_bps	12e9
3	fulcrum	bulk1_bps	20e9
1	haproxy	idle_asked	9000
1	haproxy	idle_alive	9000
1	haproxy	idle_rss0_kib	1000
1	haproxy	idle_rss1_kib	31000
1	fulcrum	idle_asked	9000
1	fulcrum	idle_alive	3000
1	fulcrum	idle_rss0_kib	5000
1	fulcrum	idle_rss1_kib	53000
1	fulcrum	idle_error:dial: timeout	5000
2	fulcrum	idle_error:dial: timeout	1000
1	fulcrum	idle_error:final ping: eof	2
3	haproxy	conn_failed	1
1	haproxy	conn_cpu_ticks	300
1	haproxy	conn_total	30000
`

var cols = []column{{"direct", "direct"}, {"haproxy", "HAProxy"}, {"fulcrum", "fulcrum"}}

func renderString(t *testing.T, tsv string) string {
	t.Helper()
	s, err := parseSamples(strings.NewReader(tsv))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	render(&b, s, cols, 100)
	return b.String()
}

// rowOf returns the table line that starts with label.
func rowOf(t *testing.T, out, label string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| "+label+" |") {
			return l
		}
	}
	t.Fatalf("no row %q in\n%s", label, out)
	return ""
}

func TestRender(t *testing.T) {
	out := renderString(t, sampleTSV)
	for _, c := range []struct{ label, want string }{
		// medians 35, 13.5, 18; ratios to direct; fulcrum ÷ best peer (HAProxy) 18/13.5
		{"bulk, 1 stream (iperf3), Gbit/s", "| 35.0 (1.00) | 13.5 (0.39) | 18.0 (0.51) | 1.33 |"},
		// one repetition of three: marked †1; ratio to HAProxy
		{"idle connections held (alive at the end, of those asked)", "| — | 9,000 of 9,000 (1.00) †1 | 3,000 of 9,000 (0.33) †1 | 0.33 |"},
		// (31000-1000)/9000 = 3.3; (53000-5000)/3000 = 16
		{"proxy RSS per idle connection, KiB ↓", "| — | 3.3 (1.00) †1 | 16.0 (4.80) †1 | 4.80 |"},
		// 300 ticks at 100 Hz = 3 s over 30,000 connections = 100 µs
		{"… proxy CPU per new connection, µs ↓", "| — | 100.0 (1.00) †1 | — | — |"},
	} {
		if got := rowOf(t, out, c.label); !strings.HasSuffix(got, c.want) {
			t.Errorf("row %q = %q; want it to end %q", c.label, got, c.want)
		}
	}
	if strings.Contains(out, "| new connections/s") {
		t.Errorf("a row no target has a figure for is in the table:\n%s", out)
	}
	for _, want := range []string{
		"**Pinned**: each proxy alone on its CPUs",
		"| workload | direct | HAProxy | fulcrum | fulcrum ÷ best peer |",
		"median of 3 repetitions; in brackets its ratio to direct for the data rows, to HAProxy for the per-proxy rows.",
		"- HAProxy, conn: 1 (run failed 1)",
		"- fulcrum, idle: 6,002 (dial: timeout 6,000; final ping: eof 2)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCountAndMedian(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {58824.4, "58,824"}, {1234567, "1,234,567"}, {-4500, "-4,500"}} {
		if got := count(c.v, nil); got != c.want {
			t.Errorf("count(%v) = %q; want %q", c.v, got, c.want)
		}
	}
	for _, c := range []struct {
		vs   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(c.vs); got != c.want {
			t.Errorf("median(%v) = %v; want %v", c.vs, got, c.want)
		}
	}
}

func TestRunErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.tsv")
	os.WriteFile(bad, []byte("1\tdirect\tbulk1_bps\n"), 0o600)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"-targets", "direct=direct"}, 2},
		{[]string{"-samples", bad, "-targets", "direct"}, 2},
		{[]string{"-samples", bad, "-targets", "direct=direct"}, 1},
		{[]string{"-samples", filepath.Join(t.TempDir(), "none"), "-targets", "direct=direct"}, 1},
	} {
		var out, errOut bytes.Buffer
		if got := run(c.args, &out, &errOut); got != c.code {
			t.Errorf("run(%q) = %d; want %d (stderr %q)", c.args, got, c.code, errOut.String())
		}
	}
}

// TestScaleTable: the scale run's parts make a table of their own for
// fulcrum, each figure a median over repetitions, with the largest over the
// smallest of each row.
func TestScaleTable(t *testing.T) {
	var tsv strings.Builder
	for rep, ticks := range map[string][4]int{"1": {100, 105, 110, 120}, "2": {100, 104, 112, 118}, "3": {90, 100, 111, 119}} {
		for i, part := range []string{"scale3", "scale1000", "scale10000", "scaleidle"} {
			tsv.WriteString(rep + "\tfulcrum\t" + part + "_cpu_ticks\t" + strconv.Itoa(ticks[i]) + "\n")
			tsv.WriteString(rep + "\tfulcrum\t" + part + "_total\t10000\n")
			tsv.WriteString(rep + "\tfulcrum\t" + part + "_p50_us\t" + strconv.Itoa(200+10*i) + "\n")
			tsv.WriteString(rep + "\tfulcrum\t" + part + "_p99_us\t900\n")
			tsv.WriteString(rep + "\tfulcrum\t" + part + "_rate\t5000\n")
		}
		tsv.WriteString(rep + "\tfulcrum\tscaleidle_held\t8900\n")
	}
	out := renderString(t, tsv.String())
	if !strings.Contains(out, "| figure | 3 backends | 1,000 backends | 10,000 backends | 3 backends, 8,900 idle held | largest ÷ smallest |") {
		t.Fatalf("no scale table heading in\n%s", out)
	}
	// CPU per connection: median ticks 100, 104, 111, 119 over 10,000
	// connections at 100 ticks/s: 100, 104, 111, 119 µs.
	if got, want := rowOf(t, out, "CPU per new connection, µs ↓"), "| CPU per new connection, µs ↓ | 100.0 | 104.0 | 111.0 | 119.0 | 1.19 |"; got != want {
		t.Errorf("CPU row:\n%s\nwant\n%s", got, want)
	}
	if got, want := rowOf(t, out, "new connections/s"), "| new connections/s | 5,000 | 5,000 | 5,000 | 5,000 | 1.00 |"; got != want {
		t.Errorf("rate row:\n%s\nwant\n%s", got, want)
	}
	if strings.Contains(renderString(t, sampleTSV), "the cost as the work grows") {
		t.Error("a run without scale samples has a scale table")
	}
}

// TestPasses: a run of both passes makes two tables, pinned first; each
// figure is the median of its own pass's repetitions, the busy row is CPU
// time over wall time over the proxy's CPUs, and the syscall rows come from
// the syscall repetition (s, us) alone, which no median includes.
func TestPasses(t *testing.T) {
	var tsv strings.Builder
	add := func(rep, target, key string, v float64) {
		tsv.WriteString(rep + "\t" + target + "\t" + key + "\t" + strconv.FormatFloat(v, 'f', -1, 64) + "\n")
	}
	for i, rep := range []string{"1", "2", "3"} {
		for _, tg := range []string{"haproxy", "fulcrum"} {
			add(rep, tg, "proxy_cpus", 1)
			add(rep, tg, "rget_rps", float64(1000+100*i))
			add(rep, tg, "rget_ops", 10000)
			add(rep, tg, "rget_wall_us", 2e6) // 2 s
		}
		add(rep, "haproxy", "rget_cpu_ticks", 190) // 1.9 s of 2 s on 1 CPU: 95%, 190 µs per request
		add(rep, "haproxy", "rget_load_busy", float64(97+i))
		add(rep, "haproxy", "rget_pcpu_busy", 96)
		add(rep, "direct", "rget_load_busy", 100)
		add(rep, "fulcrum", "rget_cpu_ticks", 100) // 50%, 100 µs
		add("u"+rep, "haproxy", "proxy_cpus", 2)
		add("u"+rep, "haproxy", "rget_rps", float64(5000+i))
		add("u"+rep, "haproxy", "rget_ops", 10000)
		add("u"+rep, "haproxy", "rget_wall_us", 1e6)
		add("u"+rep, "haproxy", "rget_cpu_ticks", 50) // 0.5 s of 1 s on 2 CPUs: 25%
	}
	// The syscall repetitions: rates there (slowed by the counting) must not
	// reach a median.
	for _, tg := range []string{"haproxy", "fulcrum"} {
		add("s", tg, "proxy_cpus", 1)
		add("s", tg, "rget_rps", 1)
		add("s", tg, "rget_ops", 1000)
	}
	add("s", "haproxy", "rget_sys", 6000)
	add("s", "haproxy", "rget_sysw", 1000)
	add("s", "fulcrum", "rget_sys", 9700)
	add("s", "fulcrum", "rget_sysw", 3000)
	add("us", "haproxy", "rget_ops", 1000)
	add("us", "haproxy", "rget_sys", 8000)
	add("us", "haproxy", "rget_sysw", 2000)
	add("s", "fulcrum", "pgrows_failed", 1)
	out := renderString(t, tsv.String())
	pinned, unpinned, ok := strings.Cut(out, "**Unpinned**")
	if !ok || !strings.Contains(pinned, "**Pinned**: each proxy alone on 1 CPU") || !strings.Contains(unpinned, "share all 2 CPUs") {
		t.Fatalf("want a pinned table on 1 CPU, then an unpinned one on 2:\n%s", out)
	}
	for _, c := range []struct{ part, label, want string }{
		{pinned, "`redis-benchmark -t get -c 50`, req/s", "| — | 1,100 | 1,100 | 1.00 |"},
		{pinned, "… proxy CPU per request, µs ↓", "| — | 190.0 (1.00) | 100.0 (0.53) | 0.53 |"},
		{pinned, "… proxy CPUs busy, %: the proxy's / anyone's (≥ 95 the proxy's: saturated)", "| — | 95 / 96 | 50 | |"},
		// the median of 97, 98, 99; direct has one too (no proxy, the same load CPUs)
		{pinned, "… load CPUs busy, % (pinned: the clients' and servers'; unpinned: all, the proxy's too)", "| 100 | 98 | — | |"},
		// 6,000 syscalls over 1,000 requests, 1,000 of them waits; fulcrum 9.7 and 3.0
		{pinned, "… proxy syscalls per request / of them epoll waits ↓", "| — | 6.0 / 1.0 (1.00) | 9.7 / 3.0 (1.62) | 1.62 |"},
		{unpinned, "`redis-benchmark -t get -c 50`, req/s", "| — | 5,001 | — | — |"},
		{unpinned, "… proxy CPUs busy, %: the proxy's / anyone's (≥ 95 the proxy's: saturated)", "| — | 25 | — | |"},
		{unpinned, "… proxy syscalls per request / of them epoll waits ↓", "| — | 8.0 / 2.0 (1.00) | — | — |"},
	} {
		if got := rowOf(t, c.part, c.label); !strings.HasSuffix(got, c.want) {
			t.Errorf("row %q = %q; want it to end %q", c.label, got, c.want)
		}
	}
	if !strings.Contains(pinned, "- fulcrum, pgrows: 1 (run failed 1)") {
		t.Errorf("a failure in the syscall repetition is not listed under the pinned table:\n%s", pinned)
	}
	if strings.Contains(out, "†") {
		t.Errorf("the syscall repetition counts as a repetition (a † mark):\n%s", out)
	}
	if !strings.Contains(pinned, "median of 3 repetitions") || !strings.Contains(unpinned, "median of 3 repetitions") {
		t.Errorf("each pass is a median of its own 3 repetitions:\n%s", out)
	}
}

// TestPaired: with an other column beside fulcrum, the report compares the
// two within each repetition. Three repetitions whose levels differ by up
// to 2 × (the machine's drift), other 10 % lower in each: every pair says
// 0.90, other is better in 3 of 3, and the sign test's p is 2/8.
func TestPaired(t *testing.T) {
	var b strings.Builder
	for rep, level := range []float64{100, 200, 150} {
		r := strconv.Itoa(rep + 1)
		b.WriteString(r + "\tfulcrum\tpp1_total\t1000\n")
		b.WriteString(r + "\tfulcrum\tpp1_cpu_ticks\t" + strconv.FormatFloat(level, 'f', -1, 64) + "\n")
		b.WriteString(r + "\tother\tpp1_total\t1000\n")
		b.WriteString(r + "\tother\tpp1_cpu_ticks\t" + strconv.FormatFloat(0.9*level, 'f', -1, 64) + "\n")
	}
	s, err := parseSamples(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	render(&out, s, []column{{"other", "fulcrum B"}, {"fulcrum", "fulcrum"}}, 100)
	// The row's label is in the main table, then in the paired one.
	paired := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| … proxy CPU per round trip, µs ↓ |") {
			paired = l
		}
	}
	if want := "| 0.900 | 3 of 3 | 0.90–0.90 | 0.25 |"; !strings.HasSuffix(paired, want) {
		t.Errorf("paired row = %q; want it to end %q\n%s", paired, want, out.String())
	}
	if !strings.Contains(out.String(), "Paired, fulcrum B against fulcrum") {
		t.Errorf("no paired heading:\n%s", out.String())
	}
	out.Reset()
	render(&out, s, []column{{"fulcrum", "fulcrum"}}, 100)
	if strings.Contains(out.String(), "Paired") {
		t.Errorf("a paired table without an other column:\n%s", out.String())
	}
}

func TestSignTest(t *testing.T) {
	for _, c := range []struct {
		k, n int
		want float64
	}{{7, 7, 2.0 / 128}, {6, 7, 16.0 / 128}, {0, 7, 2.0 / 128}, {3, 6, 1}, {9, 10, 22.0 / 1024}} {
		if got := signTest(c.k, c.n); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("signTest(%d, %d) = %v; want %v", c.k, c.n, got, c.want)
		}
	}
}
