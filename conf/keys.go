package conf

import (
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// keyProbe is a configuration that reaches every table the walker reads:
// one service with one backend, and each of them with a health table. The
// walker reads a key (and so accepts it) whether or not it is written, so
// the keys it reads while checking this file are exactly the keys any file
// may hold.
const keyProbe = `
[defaults.health]
[services.NAME]
listen = "127.0.0.1:1"
  [services.NAME.health]
  [[services.NAME.backends]]
  address = "127.0.0.1:1"
  [services.NAME.backends.health]
`

// Keys lists every key a configuration file may hold, as the walker's strict
// check reads them, spelled "table.key" with the table as a reader writes it
// in TOML: "log.level", "defaults.scheduler", "services.NAME.listen",
// "services.NAME.backends.weight", "services.NAME.backends.health.check".
// Top-level tables ([log], [services], …) are not listed as keys themselves,
// nor are service names. It is for documentation and its test: the daemon
// never calls it.
func Keys() []string {
	var tree map[string]any
	if _, err := toml.Decode(keyProbe, &tree); err != nil {
		panic("conf: key probe does not parse: " + err.Error()) // a programmer error in keyProbe
	}
	w := &walker{order: map[string]int{}, keys: map[string]bool{}, localAddrs: hostAddrs}
	w.config(w.table("", tree))
	var out []string
	for k := range w.keys {
		if !strings.Contains(k, ".") || strings.Count(k, ".") == 1 && strings.HasPrefix(k, "services.") {
			continue // a top-level table, or a service's name
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// arrayIndex matches the "[0]" the walker adds to an array table's path.
var arrayIndex = regexp.MustCompile(`\[[0-9]+\]`)

// genericPath spells a table's path as Keys lists it: the service name
// becomes NAME and an array index is dropped.
func genericPath(path string) string {
	path = arrayIndex.ReplaceAllString(path, "")
	if rest, ok := strings.CutPrefix(path, "services."); ok {
		if i := strings.IndexByte(rest, '.'); i >= 0 {
			return "services.NAME" + rest[i:]
		}
		return "services.NAME"
	}
	return path
}
