package conf

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Error is one problem in a configuration file, located by line and key.
type Error struct {
	File string // path as given to Load; "" for Parse
	Line int    // 1-based; 0 when the key is not written in the file
	Key  string // dotted key path: services.pg.backends[0].weight
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 {
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	} else if e.File != "" {
		b.WriteByte(' ')
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// walker reads the decoded TOML tree into typed values and collects every
// problem instead of stopping at the first.
type walker struct {
	file  string
	order map[string]int // service name → rank in file order, from toml's MetaData
	errs  []*Error       // lines are filled in by locate
	// ignored are keys accepted and ignored (kept so that older files
	// load), each with why: Config.Warnings reports them.
	ignored []*Error
	keys    map[string]bool // when not nil, done records every key read here, as "table.key" (see Keys)

	claims map[netip.AddrPort][]claim // listen address → the services on it, in file order (routes.go)

	localAddrs func() map[netip.Addr]bool // this host's addresses, read when a wildcard listen needs them
}

func (w *walker) errorf(key, format string, args ...any) {
	w.errs = append(w.errs, &Error{File: w.file, Key: key, Msg: fmt.Sprintf(format, args...)})
}

// ignore records that key is accepted and ignored, and why.
func (w *walker) ignore(key, why string) {
	w.ignored = append(w.ignored, &Error{File: w.file, Key: key, Msg: why})
}

// locate fills in the line of each of errs: the line of its key, or of
// the nearest written parent (a default value has no line of its own). The
// source is scanned only when there are errors or ignored keys, so a
// valid, current file costs nothing here.
func (w *walker) locate(src []byte, errs []*Error) {
	pos := locate(string(src))
	for _, e := range errs {
		e.Line = line(pos, e.Key)
	}
}

func line(pos map[string]int, key string) int {
	for key != "" {
		if n, ok := pos[key]; ok {
			return n
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// table is one TOML table being read. Every key read is marked, and done
// reports the rest as unknown, so a typo is never silently ignored.
type table struct {
	w    *walker
	path string
	m    map[string]any
	used []string // keys read; a handful, so a slice beats a map
}

func (w *walker) table(path string, m map[string]any) *table {
	return &table{w: w, path: path, m: m}
}

func (t *table) isUsed(k string) bool { return slices.Contains(t.used, k) }

func (t *table) key(k string) string { return join(t.path, k) }

// get returns the raw value of k and whether it is set.
func (t *table) get(k string) (any, bool) {
	if !t.isUsed(k) {
		t.used = append(t.used, k)
	}
	if t.m == nil {
		return nil, false
	}
	v, ok := t.m[k]
	return v, ok
}

func (t *table) has(k string) bool {
	_, ok := t.m[k]
	return ok
}

// done reports keys of this table that nothing read.
func (t *table) done() {
	if t.w.keys != nil {
		for _, k := range t.used {
			t.w.keys[join(genericPath(t.path), k)] = true
		}
	}
	var unknown []string
	for k := range t.m {
		if !t.isUsed(k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		if k == "password" && t.isUsed("password_file") {
			t.w.errorf(t.key(k), "unknown key: passwords go in password_file (a file only fulcrum can read), never in the configuration")
			continue
		}
		if s := suggest(k, slices.Clone(t.used)); s != "" {
			t.w.errorf(t.key(k), "unknown key (did you mean %q?)", s)
		} else {
			t.w.errorf(t.key(k), "unknown key")
		}
	}
}

func (t *table) str(k, def string) string {
	v, ok := t.get(k)
	if !ok {
		return def
	}
	s, ok := v.(string)
	if !ok {
		t.w.errorf(t.key(k), "want a string, have %s", typeName(v))
		return def
	}
	return s
}

// oneOf reads a string that must be one of choices.
func (t *table) oneOf(k, def string, choices ...string) string {
	s := t.str(k, def)
	for _, c := range choices {
		if s == c {
			return s
		}
	}
	if hint := enumHint(k, s, choices); hint != "" {
		t.w.errorf(t.key(k), "%q is not one of %s (%s)", s, strings.Join(choices, ", "), hint)
	} else {
		t.w.errorf(t.key(k), "%q is not one of %s", s, strings.Join(choices, ", "))
	}
	return def
}

func (t *table) boolean(k string, def bool) bool {
	v, ok := t.get(k)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		t.w.errorf(t.key(k), "want true or false, have %s", typeName(v))
		return def
	}
	return b
}

// integer reads an integer within [lo, hi].
func (t *table) integer(k string, def, lo, hi int64) int64 {
	v, ok := t.get(k)
	if !ok {
		return def
	}
	n, ok := v.(int64)
	if !ok {
		t.w.errorf(t.key(k), "want an integer, have %s", typeName(v))
		return def
	}
	if n < lo || n > hi {
		switch {
		case n < 0 && lo == 0:
			t.w.errorf(t.key(k), "must not be negative, have %d", n)
		default:
			t.w.errorf(t.key(k), "must be between %d and %d, have %d", lo, hi, n)
		}
		return def
	}
	return n
}

// number reads a number (integer or float) within [lo, hi].
func (t *table) number(k string, def, lo, hi float64) float64 {
	v, ok := t.get(k)
	if !ok {
		return def
	}
	var f float64
	switch v := v.(type) {
	case int64:
		f = float64(v)
	case float64:
		f = v
	default:
		t.w.errorf(t.key(k), "want a number, have %s", typeName(v))
		return def
	}
	if f < lo || f > hi || f != f {
		t.w.errorf(t.key(k), "must be between %g and %g, have %g", lo, hi, f)
		return def
	}
	return f
}

// duration reads a Go duration string ("3s", "1m30s") that is ≥ min.
func (t *table) duration(k string, def, min time.Duration) time.Duration {
	v, ok := t.get(k)
	if !ok {
		return def
	}
	s, ok := v.(string)
	if !ok {
		t.w.errorf(t.key(k), `want a duration string such as "3s", have %s`, typeName(v))
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.w.errorf(t.key(k), `%q is not a duration (use a number with a unit: "250ms", "3s", "5m")`, s)
		return def
	}
	if d < min {
		if min == 0 {
			t.w.errorf(t.key(k), "must not be negative, have %s", s)
		} else {
			t.w.errorf(t.key(k), "must be at least %s, have %s", min, s)
		}
		return def
	}
	return d
}

// strs reads an array of strings; a single string is accepted as a list of
// one. On a type error it reports it and returns nil, true.
func (t *table) strs(k string) ([]string, bool) {
	v, ok := t.get(k)
	if !ok {
		return nil, false
	}
	switch v := v.(type) {
	case string:
		return []string{v}, true
	case []any:
		out := make([]string, 0, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				t.w.errorf(fmt.Sprintf("%s[%d]", t.key(k), i), "want a string, have %s", typeName(e))
				continue
			}
			out = append(out, s)
		}
		return out, true
	}
	t.w.errorf(t.key(k), "want an array of strings, have %s", typeName(v))
	return nil, true
}

// sub reads a nested table; a missing one reads as empty.
func (t *table) sub(k string) *table {
	v, ok := t.get(k)
	m, isMap := v.(map[string]any)
	if ok && !isMap {
		t.w.errorf(t.key(k), "want a table, have %s", typeName(v))
	}
	return t.w.table(t.key(k), m)
}

// tables reads an array of tables ([[k]] or k = [{...}, ...]).
func (t *table) tables(k string) ([]*table, bool) {
	v, ok := t.get(k)
	if !ok {
		return nil, false
	}
	var ms []map[string]any
	switch v := v.(type) {
	case []map[string]any:
		ms = v
	case []any:
		for i, e := range v {
			m, ok := e.(map[string]any)
			if !ok {
				t.w.errorf(fmt.Sprintf("%s[%d]", t.key(k), i), "want a table, have %s", typeName(e))
				continue
			}
			ms = append(ms, m)
		}
	default:
		t.w.errorf(t.key(k), "want an array of tables ([[%s]]), have %s", t.key(k), typeName(v))
		return nil, true
	}
	out := make([]*table, len(ms))
	prefix := t.key(k) + "["
	for i, m := range ms {
		out[i] = t.w.table(prefix+strconv.Itoa(i)+"]", m)
	}
	return out, true
}

func typeName(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	case time.Time:
		return "a date-time"
	}
	return fmt.Sprintf("%T", v)
}

// suggest returns the known key closest to k, if it is a plausible typo.
func suggest(k string, known []string) string {
	best, bestD := "", 3
	sort.Strings(known)
	for _, c := range known {
		if d := distance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
