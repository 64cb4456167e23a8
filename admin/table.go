package admin

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints st the way `ipvsadm -Ln --stats` prints LVS: one block
// per service, one row per backend.
func WriteTable(w io.Writer, st Status) {
	fmt.Fprintf(w, "fulcrum %s  generation %d  reloads %d (%d refused)", st.Version, st.Generation, st.Reload.Reloads, st.Reload.Failed)
	if !st.Reload.Applied.IsZero() {
		fmt.Fprintf(w, "  applied %s", st.Reload.Applied.Local().Format(time.DateTime))
	}
	fmt.Fprintln(w)
	if st.Reload.LastError != "" {
		fmt.Fprintf(w, "last reload refused: %s\n", st.Reload.LastError)
	}
	if is := st.Instance; is != nil {
		health := "healthy"
		if !is.Healthy {
			health = "unhealthy"
		}
		fmt.Fprintf(w, "instance %s: %s\n", health, is.Reason)
	}
	for _, s := range st.Services {
		fmt.Fprintf(w, "\nservice %s  %s  listen %s  active %d  waiting %d  retries %d  refused %d\n", s.Name, s.Scheduler,
			strings.Join(s.Listen, " "), s.Active, s.Waiting, s.Retries, s.Refused)
		if len(s.SplitBrain) > 0 {
			fmt.Fprintf(w, "  SPLIT BRAIN: %s claim primary\n", strings.Join(s.SplitBrain, ", "))
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  backend\taddress\tweight\tstate\tactive\tconns\tbytes in\tbytes out\tconnect fails")
		for _, b := range s.Backends {
			state := b.State
			if b.Role != "" {
				state += " (" + b.Role + ")"
			}
			if b.Backup {
				state += " (backup)"
			}
			if b.Reason != "" && b.State != "up" {
				state += " (" + b.Reason + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%d\n", b.Name, b.Address, b.Weight, state,
				b.Active, b.Total, bytes(b.BytesIn), bytes(b.BytesOut), b.ConnectFails)
		}
		tw.Flush()
	}
	if len(st.Listeners) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "listener\tbound\taccepts\taccept errors")
		for _, l := range st.Listeners {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", l.Listen, l.Addr, l.Accepts, l.AcceptErrors)
		}
		tw.Flush()
	}
}

// bytes formats n in binary units.
func bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
