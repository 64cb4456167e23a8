package conf

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteSummary prints what -check validated, on one screen.
func (cfg *Config) WriteSummary(w io.Writer) {
	fmt.Fprintf(w, "%s: configuration is valid\n", cfg.File)
	fmt.Fprintf(w, "log: level %s, format %s, access log %v\n", cfg.Log.Level, cfg.Log.Format, onOff(cfg.Log.Access))
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
			case "after":
				params = fmt.Sprintf(" (failback after:%s)", s.FailbackAfter)
			case "never", "manual":
				params = " (failback " + s.Failback + ")"
			}
		}
		fmt.Fprintf(w, "\nservice %s  scheduler %s%s  listen %s\n", s.Name, s.Scheduler, params, strings.Join(listen, " "))
		fmt.Fprintf(w, "  connect_timeout %s  idle_timeout %s  retries %d  drain_timeout %s\n",
			s.ConnectTimeout, durOrNone(s.IdleTimeout), s.Retries, durOrNone(s.DrainTimeout))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  backend\taddress\tweight\t")
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
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", b.Name, addr, weight)
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
