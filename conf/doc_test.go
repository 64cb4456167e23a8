package conf

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocumentedKeys holds docs/configuration.md and the walker to the same
// keys, both ways: a key conf accepts that the reference does not list is
// undocumented, and a key the reference lists that conf refuses is a lie.
//
// The reference lists keys in Markdown tables whose header starts
// "| key | where |": the first cell names one or more keys in backquotes, the
// second every table the key may appear in, each in backquotes as written in
// TOML (`[defaults]`, `[services.NAME]`, `[[services.NAME.backends]]`,
// `[services.NAME.backends.health]`).
func TestDocumentedKeys(t *testing.T) {
	documented := documentedKeys(t, "../docs/configuration.md")
	accepted := Keys()
	if len(accepted) < 20 {
		t.Fatalf("Keys() = %d keys; want the full schema", len(accepted))
	}
	for _, k := range accepted {
		if _, ok := documented[k]; !ok {
			t.Errorf("%s: accepted by conf but not in docs/configuration.md; add a row (or add the table to its where column)", k)
		}
	}
	for k, line := range documented {
		if !slices.Contains(accepted, k) {
			t.Errorf("docs/configuration.md:%d: %s is documented but conf does not accept it", line, k)
		}
	}
}

// documentedKeys maps "table.key" to the line of the row that documents it.
func documentedKeys(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		code   = regexp.MustCompile("`([^`]+)`")
		tables = regexp.MustCompile("`\\[\\[?([A-Za-z0-9_.]+)\\]\\]?`")
		out    = map[string]int{}
		inKeys bool // inside a "| key | where |" table
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			inKeys = false
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		first, second := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		if first == "key" && second == "where" {
			inKeys = true
			continue
		}
		if !inKeys || strings.HasPrefix(first, "---") {
			continue
		}
		keys := code.FindAllStringSubmatch(first, -1)
		where := tables.FindAllStringSubmatch(second, -1)
		if len(keys) == 0 || len(where) == 0 {
			t.Errorf("%s:%d: a key row needs `key` in its first cell and `[table]` in its second: %s", path, n, line)
			continue
		}
		for _, k := range keys {
			for _, w := range where {
				out[w[1]+"."+k[1]] = n
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
