package systemd

import (
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends sd_notify(3) messages to the service manager. The zero
// value reads the process environment; tests set Getenv.
type Notifier struct {
	// Getenv reads NOTIFY_SOCKET and WATCHDOG_*; nil means os.Getenv.
	Getenv func(string) string
}

func (n *Notifier) getenv(k string) string {
	if n != nil && n.Getenv != nil {
		return n.Getenv(k)
	}
	return os.Getenv(k)
}

// Notify sends state (newline-separated assignments such as "READY=1") to
// $NOTIFY_SOCKET. It returns, as go-systemd's SdNotify does:
//
//	(false, nil) notification not supported (NOTIFY_SOCKET is unset)
//	(false, err) notification supported, but sending failed
//	(true, nil)  notification sent
func (n *Notifier) Notify(state string) (bool, error) {
	return n.send(state, nil)
}

// Messages, as sd_notify(3) names them.
const (
	Ready     = "READY=1"
	Stopping  = "STOPPING=1"
	Watchdog  = "WATCHDOG=1"
	reloading = "RELOADING=1"
)

// Reloading is RELOADING=1 with the MONOTONIC_USEC that Type=notify-reload
// (systemd ≥ 253) requires; on older systemd the extra field is ignored.
func Reloading() string {
	return reloading + "\nMONOTONIC_USEC=" + strconv.FormatInt(MonotonicUsec(), 10)
}

// Status is a STATUS= line: free text that systemctl status shows.
func Status(s string) string { return "STATUS=" + s }

// MonotonicUsec is CLOCK_MONOTONIC in microseconds.
func MonotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1000
}

// WatchdogInterval returns how often to send WATCHDOG=1 — half of
// WATCHDOG_USEC, as sd_watchdog_enabled(3) advises — or 0 when the watchdog
// is off or meant for another process (WATCHDOG_PID).
func (n *Notifier) WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(n.getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := n.getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
