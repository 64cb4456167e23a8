package admin

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// servedMetrics lists every metric name /metrics can serve: fulcrum's own,
// from the collector's descriptions (a scrape shows per-backend series only
// when backends exist), and the Go and process collectors', from a scrape.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	ch := make(chan *prometheus.Desc, 100)
	(&collector{}).Describe(ch)
	close(ch)
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names[m[1]] = true
	}
	mfs, err := registry(emptySource()).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

var (
	labelMatchers = regexp.MustCompile(`\{[^}]*\}`)
	stringLits    = regexp.MustCompile(`"[^"]*"`)
	rangeSel      = regexp.MustCompile(`\[[^\]]*\]`)
	grouping      = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identifier    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	labelValues   = regexp.MustCompile(`label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)`)
	promqlWords   = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

// exprMetrics returns the metric names a PromQL expression selects: the
// identifiers left once label matchers, strings, ranges and grouping lists
// are gone, less function names and keywords.
func exprMetrics(expr string) []string {
	if m := labelValues.FindStringSubmatch(expr); m != nil { // a Grafana variable query
		return []string{m[1]}
	}
	expr = labelMatchers.ReplaceAllString(expr, "")
	expr = stringLits.ReplaceAllString(expr, "")
	expr = rangeSel.ReplaceAllString(expr, "")
	expr = grouping.ReplaceAllString(expr, "")
	var out []string
	for _, loc := range identifier.FindAllStringIndex(expr, -1) {
		word := expr[loc[0]:loc[1]]
		if loc[0] > 0 && expr[loc[0]-1] == '$' { // a Grafana variable
			continue
		}
		if rest := strings.TrimLeft(expr[loc[1]:], " \t"); strings.HasPrefix(rest, "(") { // a function
			continue
		}
		if slices.Contains(promqlWords, strings.ToLower(word)) {
			continue
		}
		out = append(out, word)
	}
	return out
}

func TestExprMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (service, backend) (rate(fulcrum_backend_connections_total{instance=~"$instance"}[$__rate_interval]))`: {"fulcrum_backend_connections_total"},
		`(process_open_fds / process_max_fds) > 0.8 and on (instance, job) fulcrum_build_info`:                         {"process_open_fds", "process_max_fds", "fulcrum_build_info"},
		`time() - fulcrum_config_last_reload_timestamp_seconds{instance=~"$instance"}`:                                 {"fulcrum_config_last_reload_timestamp_seconds"},
		`label_values(fulcrum_build_info, instance)`:                                                                   {"fulcrum_build_info"},
	} {
		if got := exprMetrics(expr); !slices.Equal(got, want) {
			t.Errorf("exprMetrics(%q) = %q; want %q", expr, got, want)
		}
	}
}

// TestMonitoringNamesExist: every query of the Grafana dashboard and every
// alerting rule in docs/monitoring names a metric that /metrics serves, so
// a renamed metric cannot leave an empty panel or a silent alert.
func TestMonitoringNamesExist(t *testing.T) {
	served := servedMetrics(t)
	used := map[string]bool{}
	check := func(where, expr string) {
		t.Helper()
		names := exprMetrics(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !served[n] {
				t.Errorf("%s: %q names %s, which /metrics does not serve", where, expr, n)
			}
		}
	}

	data, err := os.ReadFile("../docs/monitoring/fulcrum.dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name       string
				Type       string
				Definition string
			}
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("fulcrum.dashboard.json: %v", err)
	}
	queries := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			check("dashboard panel "+p.Title, tg.Expr)
			queries++
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			check("dashboard variable "+v.Name, v.Definition)
		}
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries; want the full set", queries)
	}

	rules, err := os.ReadFile("../docs/monitoring/fulcrum.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	exprs := regexp.MustCompile(`(?m)^\s*expr:\s*(.+)$`).FindAllStringSubmatch(string(rules), -1)
	if len(exprs) < 5 {
		t.Fatalf("fulcrum.rules.yml: %d expr: lines; want one per rule", len(exprs))
	}
	for _, m := range exprs {
		check("fulcrum.rules.yml", m[1])
	}

	var unused []string
	for n := range served {
		if strings.HasPrefix(n, "fulcrum_") && !used[n] {
			unused = append(unused, n)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		t.Logf("fulcrum metrics on no panel and in no rule: %v", unused)
	}
}

// TestMetricsDocumented: docs/operations.md lists every fulcrum metric
// /metrics serves, and names none that it does not.
func TestMetricsDocumented(t *testing.T) {
	served := servedMetrics(t)
	data, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`(fulcrum_[a-z_]+)").FindAllStringSubmatch(string(data), -1) {
		named[m[1]] = true
		if !served[m[1]] {
			t.Errorf("docs/operations.md names %s, which /metrics does not serve", m[1])
		}
	}
	for n := range served {
		if strings.HasPrefix(n, "fulcrum_") && !named[n] {
			t.Errorf("%s is served but not listed in docs/operations.md (Status, metrics and health)", n)
		}
	}
}
