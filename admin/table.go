package admin

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"fulcrum/backend"
	"fulcrum/status"
)

// WriteTable prints st the way `ipvsadm -Ln --stats` prints LVS: one block
// per service, one row per backend, its state with a short cause. The whole
// reason goes on a line of its own under the table, only with verbose, so
// that one long reason never pads every row.
func WriteTable(w io.Writer, st Status) { writeTable(w, st, false, time.Now()) }

// WriteTableVerbose is WriteTable with each backend's whole reason, who set
// an override, and the last check's error.
func WriteTableVerbose(w io.Writer, st Status) { writeTable(w, st, true, time.Now()) }

func writeTable(w io.Writer, st Status, verbose bool, now time.Time) {
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
		active := fmt.Sprint(s.Active)
		if s.MaxConns > 0 {
			active += fmt.Sprintf("/%d", s.MaxConns)
		}
		fmt.Fprintf(w, "\nservice %s  %s  listen %s  active %s  waiting %d  retries %d  refused %d\n", s.Name, s.Scheduler,
			strings.Join(s.Listen, " "), active, s.Waiting, s.Retries, s.Refused)
		if len(s.SplitBrain) > 0 {
			fmt.Fprintf(w, "  SPLIT BRAIN: %s claim primary\n", strings.Join(s.SplitBrain, ", "))
		}
		if s.Hint != "" {
			fmt.Fprintf(w, "  hint: %s\n", s.Hint)
		}
		switch s.Serving {
		case status.ServingFallback:
			fmt.Fprintf(w, "  fallback: %s%s: no backend of its own is eligible\n", s.Fallback, sinceWhen(s.ServingSince, now))
		case status.ServingHolding:
			fmt.Fprintf(w, "  HOLDING%s: no eligible backend; new connections wait (hold_timeout)\n", sinceWhen(s.ServingSince, now))
		case status.ServingRefusing:
			fmt.Fprintf(w, "  REFUSING%s: no eligible backend; new connections are closed\n", sinceWhen(s.ServingSince, now))
		}
		if len(s.Unserved) > 0 || s.Held > 0 || s.Fallbacks > 0 {
			fmt.Fprintf(w, "  ended without a backend: %s;  held %d (expired %d);  fallbacks %d\n", counts(s.Unserved), s.Held, s.HoldExpired, s.Fallbacks)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  backend\taddress\tweight\tstate\tsince\tlast check\tactive\tconns\tbytes in\tbytes out\tconnect fails")
		var notes []string
		for _, b := range s.Backends {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\n", b.Name, b.Address, weight(b), stateCell(b, now),
				ago(b.Since, now), lastCheck(b.LastCheck, now), b.Active, b.Total, bytes(b.BytesIn), bytes(b.BytesOut), b.ConnectFails)
			if verbose && (b.Transitions > 0 || b.DowntimeSeconds > 0) {
				notes = append(notes, fmt.Sprintf("  %s: %d state changes, down %s in all", b.Name, b.Transitions, short(time.Duration(b.DowntimeSeconds*float64(time.Second)))))
			}
			if verbose && b.Reason != "" {
				notes = append(notes, fmt.Sprintf("  %s: %s", b.Name, b.Reason))
			}
			if verbose && b.LastCheck != nil && b.LastCheck.Error != "" && !strings.Contains(b.Reason, b.LastCheck.Error) {
				notes = append(notes, fmt.Sprintf("  %s: last check: %s", b.Name, b.LastCheck.Error))
			}
		}
		tw.Flush()
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
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
	for _, l := range st.Listeners {
		writeRoutes(w, l)
	}
}

// writeRoutes prints the routes of a listener routed by name, and what it
// refused before any service, by reason.
func writeRoutes(w io.Writer, l ListenStatus) {
	if len(l.Routes) == 0 {
		return
	}
	fmt.Fprintf(w, "\nroutes on %s", l.Listen)
	reasons := make([]string, 0, len(l.Refused))
	for r := range l.Refused {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	for i, r := range reasons {
		sep := ", "
		if i == 0 {
			sep = "  refused: "
		}
		fmt.Fprintf(w, "%s%s %d", sep, r, l.Refused[r])
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range l.Routes {
		alpn := ""
		if len(r.ALPN) > 0 {
			alpn = " alpn " + strings.Join(r.ALPN, ",")
		}
		fmt.Fprintf(tw, "  %s%s\t→ %s\n", strings.Join(r.SNI, " "), alpn, r.Service)
	}
	tw.Flush()
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

// weight is "effective/configured", or one number when they agree.
func weight(b BackendStatus) string {
	if b.Removed {
		return "-"
	}
	if b.Weight == b.Configured {
		return fmt.Sprint(b.Weight)
	}
	return fmt.Sprintf("%d/%d", b.Weight, b.Configured)
}

// stateCell is the state with its short cause, role, backup flag and, for a
// drain with a deadline, the time left: "down (check)", "draining (removed,
// 9s left)", "up (primary, backup)".
func stateCell(b BackendStatus, now time.Time) string {
	var notes []string
	if b.Cause != "" && !strings.Contains(b.State, b.Cause) { // "wrong role" needs no "(role)"
		notes = append(notes, b.Cause)
	}
	if b.Role != "" {
		notes = append(notes, b.Role)
	}
	if b.LagSeconds != nil && b.Role == backend.RoleReplica {
		notes = append(notes, "lag "+latency(*b.LagSeconds*1000))
	}
	if b.Backup {
		notes = append(notes, "backup")
	}
	if !b.DrainDeadline.IsZero() {
		notes = append(notes, short(max(0, b.DrainDeadline.Sub(now)))+" left")
	}
	if len(notes) == 0 {
		return b.State
	}
	return b.State + " (" + strings.Join(notes, ", ") + ")"
}

// lastCheck is "ok 1.2ms 3s ago", "failed 1s 2s ago", or "-" without checks.
func lastCheck(c *status.LastCheck, now time.Time) string {
	if c == nil {
		return "-"
	}
	res := "ok"
	if !c.OK {
		res = "failed"
	}
	return fmt.Sprintf("%s %s, %s ago", res, latency(c.LatencyMS), short(now.Sub(c.At)))
}

// latency formats a check's milliseconds as HAProxy's LastChk does, to a
// useful precision: "180µs", "2.5ms", "1.20s".
func latency(ms float64) string {
	switch {
	case ms < 1:
		return fmt.Sprintf("%.0fµs", ms*1000)
	case ms < 1000:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.2fs", ms/1000)
}

// ago is how long ago t was, briefly; "-" for the zero time.
func ago(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return short(now.Sub(t)) + " ago"
}

// short formats d to its two largest units: "45s", "3m12s", "2h5m", "3d4h".
func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// sinceWhen is " (since 15:04:05, 3m ago)", or "" for the zero time.
func sinceWhen(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	return fmt.Sprintf(" (since %s, %s ago)", t.Local().Format(time.TimeOnly), short(now.Sub(t)))
}

// counts is "connect failed 2, no backend 30" in the order of the names;
// "none" when empty.
func counts(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// WriteEvents prints the recent state changes, oldest first, one a line:
// "2026-12-01 20:30:10.393  ro/pg1  up → down  check failed 2 times: …".
func WriteEvents(w io.Writer, events []backend.Event) {
	if len(events) == 0 {
		fmt.Fprintln(w, "no state changes since start")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "time\twhat\tchange\treason")
	for _, e := range events {
		what := e.Service
		if what == "" {
			what = "(reload)"
		}
		if e.Backend != "" {
			what += "/" + e.Backend
		}
		fmt.Fprintf(tw, "%s\t%s\t%s → %s\t%s\n", e.At.Local().Format("2006-01-02 15:04:05.000"), what, e.From, e.To, e.Reason)
	}
	tw.Flush()
}
