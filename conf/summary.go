package conf

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"fulcrum/health"
)

// WriteSummary prints what -check validated, on one screen.
func (cfg *Config) WriteSummary(w io.Writer) {
	fmt.Fprintf(w, "%s: configuration is valid\n", cfg.File)
	fmt.Fprintf(w, "log: level %s, format %s, access log %v\n", cfg.Log.Level, cfg.Log.Format, onOff(cfg.Log.Access))
	if a := cfg.Admin; a.Listen.IsValid() {
		fmt.Fprintf(w, "admin: listen %s (the console, /metrics, /status, /healthz)", a.Listen)
		if len(a.Hosts) > 0 {
			fmt.Fprintf(w, "  hosts %s", strings.Join(a.Hosts, " "))
		}
		if a.StateFile != "" {
			fmt.Fprintf(w, "  state_file %s", a.StateFile)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "admin: off (no [admin] listen: no console, metrics or fulcrum status)")
	}
	for _, s := range cfg.Services {
		listen := make([]string, len(s.Listen))
		for i, a := range s.Listen {
			listen[i] = a.String()
		}
		params := ""
		switch s.Scheduler { // only the parameters this scheduler reads
		case "p2c":
			params = fmt.Sprintf(" (choices %d)", s.Choices)
		case "sh":
			params = fmt.Sprintf(" (hash_key %s)", s.HashKey)
		case "mh":
			params = fmt.Sprintf(" (hash_key %s, table_size %d)", s.HashKey, s.TableSize)
		case "first":
			switch s.Failback {
			case FailbackAfter:
				params = fmt.Sprintf(" (failback after:%s)", s.FailbackAfter)
			case FailbackNever, FailbackManual:
				params = fmt.Sprintf(" (failback %s)", s.Failback)
			}
		}
		fmt.Fprintf(w, "\nservice %s  scheduler %s%s  listen %s\n", s.Name, s.Scheduler, params, strings.Join(listen, " "))
		fmt.Fprintf(w, "  connect_timeout %s  idle_timeout %s  retries %d  drain_timeout %s\n",
			s.ConnectTimeout, durOrNone(s.IdleTimeout), s.Retries, durOrNone(s.DrainTimeout))
		if line := failover(s); line != "" {
			fmt.Fprintf(w, "  %s\n", line)
		}
		if h := checkLine(s.Health); h != "" {
			fmt.Fprintf(w, "  health: %s\n", h)
		}
		if s.Source.Client {
			fmt.Fprintln(w, `  source "client": backends see each client's own address (needs CAP_NET_ADMIN and the route back, which the daemon tests at start and reload; -check does not)`)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  backend\taddress\tweight\tnotes\t")
		for _, b := range s.Backends {
			addr := b.Address
			if b.Host != "" {
				addr += " (resolved by the daemon)"
			} else if a := b.Addr.String(); a != b.Address {
				addr += " (" + a + ")"
			}
			weight := fmt.Sprint(b.Weight)
			if b.Weight == 0 {
				weight += " (drain)"
			}
			var notes []string
			if b.Backup {
				notes = append(notes, "backup")
			}
			if b.MaxConns > 0 {
				notes = append(notes, fmt.Sprintf("max_conns %d", b.MaxConns))
			}
			if b.OnDown != s.OnDown {
				notes = append(notes, "on_down "+string(b.OnDown))
			}
			if h, sh := checkLine(b.Health), checkLine(s.Health); h != sh {
				// only what differs from the service's
				var diff []string
				for _, p := range strings.Split(h, ", ") {
					if !slices.Contains(strings.Split(sh, ", "), p) {
						diff = append(diff, p)
					}
				}
				notes = append(notes, "health: "+strings.Join(diff, ", "))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t\n", b.Name, addr, weight, strings.Join(notes, ", "))
		}
		tw.Flush()
	}
	cfg.writeRoutes(w)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func durOrNone(d interface{ String() string }) string {
	if s := d.String(); s != "0s" {
		return s
	}
	return "none"
}

// failover is the service's line about what happens when backends fail:
// its fallback, hold_timeout, on_down, split_brain and limits; "" when
// all are at their defaults.
func failover(s Service) string {
	var parts []string
	if s.Fallback != "" {
		parts = append(parts, "fallback "+s.Fallback)
	}
	if s.HoldTimeout > 0 {
		parts = append(parts, "hold_timeout "+s.HoldTimeout.String())
	}
	parts = append(parts, "on_down "+string(s.OnDown))
	if s.OnUp != OnUpKeep {
		parts = append(parts, "on_up "+string(s.OnUp))
	}
	if s.Health.Role == RolePrimary {
		parts = append(parts, "split_brain "+string(s.SplitBrain))
	}
	if s.MaxConns > 0 {
		parts = append(parts, fmt.Sprintf("max_conns %d", s.MaxConns))
	}
	if s.MaxFails > 0 {
		parts = append(parts, fmt.Sprintf("passive: max_fails %d in %s", s.MaxFails, s.FailTimeout))
	} else {
		parts = append(parts, "passive: off")
	}
	return strings.Join(parts, "  ")
}

// checkLine sums up an active check: "pgsql every 1s (timeout 1s, rise 1,
// fall 2), role replica, max_lag 10s, user fulcrum_check, password_file …";
// "none" without checks.
func checkLine(h Health) string {
	if h.Check == health.CheckNone || h.Check == "" {
		return "none"
	}
	line := fmt.Sprintf("%s every %s (timeout %s, rise %d, fall %d)", h.Check, h.Interval, h.Timeout, h.Rise, h.Fall)
	if h.Role != "" && h.Role != RoleAny {
		line += ", role " + h.Role
	}
	if h.MaxLag > 0 {
		line += ", max_lag " + h.MaxLag.String()
	}
	if h.Address != "" {
		line += ", at " + h.Address
	} else if h.Port > 0 {
		line += fmt.Sprintf(", port %d", h.Port)
	}
	if h.Check == health.CheckPgSQL || h.Check == health.CheckMySQL {
		line += ", user " + h.User
	}
	if h.PasswordFile != "" {
		line += ", password_file " + h.PasswordFile
	}
	if h.Check == health.CheckHTTP {
		line += fmt.Sprintf(", GET %s → %d", h.Path, h.Status)
	}
	return line
}
