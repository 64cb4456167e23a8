package conf

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// What other balancers and databases call the values fulcrum's enums
// take: a name someone brings from HAProxy, nginx or their database's own
// words is answered with fulcrum's, and why when it differs in kind.
var enumAliases = map[string]map[string]string{
	"scheduler": {
		"leastconn":   `did you mean "wlc"? HAProxy's leastconn weighs its servers, as wlc does; lc ignores weights`,
		"least_conn":  `did you mean "wlc"? nginx's least_conn weighs its servers, as wlc does; lc ignores weights`,
		"roundrobin":  `did you mean "swrr"? HAProxy's roundrobin is weighted and interleaved, as swrr is`,
		"round_robin": `did you mean "swrr"? weighted and interleaved, as nginx's default and HAProxy's roundrobin are`,
		"static-rr":   `did you mean "wrr"? HAProxy's static-rr is a fixed weighted order, as wrr is`,
		"source":      `did you mean "sh"? HAProxy's balance source hashes the client address; "mh" keeps most clients in place when backends change (hash-type consistent)`,
		"ip_hash":     `did you mean "sh"? nginx's ip_hash hashes the client address; "mh" keeps most clients in place when backends change`,
		"hash":        `did you mean "mh"? a consistent hash of the client address (nginx's hash … consistent)`,
		"consistent":  `did you mean "mh"? Maglev consistent hashing of the client address`,
		"random2":     `did you mean "p2c"? the best of two weighted draws (nginx's random two least_conn)`,
		"wrandom2":    `did you mean "p2c"? the best of two weighted draws`,
		"leastconns":  `did you mean "wlc"? least connections, weighted`,
	},
	"role": {
		"master":    `did you mean "primary"?`,
		"leader":    `did you mean "primary"?`,
		"slave":     `did you mean "replica"?`,
		"standby":   `did you mean "replica"?`,
		"replicas":  `did you mean "replica"?`,
		"secondary": `did you mean "replica"?`,
	},
	"check": {
		"postgres":   `did you mean "pgsql"?`,
		"postgresql": `did you mean "pgsql"?`,
		"pg":         `did you mean "pgsql"?`,
		"psql":       `did you mean "pgsql"?`,
		"mariadb":    `did you mean "mysql"?`,
		"galera":     `did you mean "mysql"?`,
		"https":      `did you mean "http"?`,
		"tcp-check":  `did you mean "tcp" or "send-expect"?`,
	},
}

// enumHint says what a value v of key k that is not one of choices most
// likely meant: a known alias, else the closest choice by edit distance,
// else "".
func enumHint(k, v string, choices []string) string {
	if h, ok := enumAliases[k][strings.ToLower(v)]; ok {
		return h
	}
	low := strings.ToLower(v)
	if slices.Contains(choices, low) {
		return fmt.Sprintf("did you mean %q? names are lower case", low)
	}
	if s := suggest(low, slices.Clone(choices)); s != "" && len(v) > 2 {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return ""
}

// unweighted are the schedulers that ignore weights other than 0, with
// the weighted one to use instead.
var unweighted = map[string]string{"rr": "wrr", "random": "wrandom", "lc": "wlc"}

// Warnings are what is valid but most likely not meant: a key that is
// accepted and ignored (copy), located as errors are, a scheduler that
// ignores weights over backends of different weights, and a password
// file others can read. -check prints them, and the start and each reload
// log them.
func (c *Config) Warnings() []string {
	out := slices.Clone(c.ignored)
	for _, s := range c.Services {
		if alt, ok := unweighted[string(s.Scheduler)]; ok {
			var ws []int
			for _, b := range s.Backends {
				if b.Weight > 0 && !slices.Contains(ws, b.Weight) {
					ws = append(ws, b.Weight)
				}
			}
			if len(ws) > 1 {
				out = append(out, fmt.Sprintf("services.%s: scheduler %q ignores weights, and its backends have different weights (%s); use %q to honour them (HAProxy's and nginx's least-connection and round-robin balancers are weighted)",
					s.Name, s.Scheduler, joinInts(ws), alt))
			}
		}
	}
	seen := map[string]bool{}
	for _, f := range c.passwordFiles() {
		if seen[f] {
			continue
		}
		seen[f] = true
		if why := readableByOthers(f); why != "" {
			out = append(out, why)
		}
	}
	return out
}

func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = fmt.Sprint(n)
	}
	return strings.Join(parts, ", ")
}

// passwordFiles lists every password file the configuration names, in
// file order, as resolved.
func (c *Config) passwordFiles() []string {
	var out []string
	for _, s := range c.Services {
		for _, b := range s.Backends {
			if f := b.Health.PasswordFile; f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}

// readableByOthers says why the password file at path is exposed, or "":
// one that its group or others may read gives the check's password away.
func readableByOthers(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	if m := fi.Mode().Perm(); m&0o044 != 0 {
		who := "its group"
		if m&0o004 != 0 {
			who = "others"
		}
		return fmt.Sprintf("password file %s is readable by %s (mode %#o): chmod go-r it (under systemd, keep it root-owned 0400 and pass it with LoadCredential=; see docs/databases.md)", path, who, m)
	}
	return ""
}
