package systemd

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listen returns a unixgram socket standing in for systemd's NOTIFY_SOCKET.
func listen(t *testing.T) (*net.UnixConn, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, path
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestNotify(t *testing.T) {
	t.Parallel()
	sock, path := listen(t)
	tests := []struct {
		name    string
		env     map[string]string
		sent    bool
		wantErr bool
	}{
		{"unset: not supported", map[string]string{}, false, false},                            // (false, nil)
		{"sent", map[string]string{"NOTIFY_SOCKET": path}, true, false},                        // (true, nil)
		{"no such socket", map[string]string{"NOTIFY_SOCKET": path + ".missing"}, false, true}, // (false, err)
	}
	for _, tt := range tests {
		n := &Notifier{Getenv: env(tt.env)}
		sent, err := n.Notify(Ready + "\n" + Status("ok"))
		if sent != tt.sent || (err != nil) != tt.wantErr {
			t.Errorf("%s: Notify = %v, %v; want %v, error %v", tt.name, sent, err, tt.sent, tt.wantErr)
		}
	}
	sock.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := sock.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=ok" {
		t.Errorf("received %q, %v", buf[:n], err)
	}
}

func TestReloading(t *testing.T) {
	t.Parallel()
	before := MonotonicUsec()
	msg := Reloading()
	usec, err := strconv.ParseInt(strings.TrimPrefix(msg, "RELOADING=1\nMONOTONIC_USEC="), 10, 64)
	if !strings.HasPrefix(msg, "RELOADING=1\nMONOTONIC_USEC=") || err != nil || usec < before || usec > MonotonicUsec() {
		t.Errorf("Reloading() = %q", msg)
	}
}

func TestWatchdogInterval(t *testing.T) {
	t.Parallel()
	me := strconv.Itoa(os.Getpid())
	tests := []struct {
		env  map[string]string
		want time.Duration
	}{
		{map[string]string{}, 0},
		{map[string]string{"WATCHDOG_USEC": "20000000"}, 10 * time.Second},
		{map[string]string{"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": me}, 10 * time.Second},
		{map[string]string{"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, 0},
		{map[string]string{"WATCHDOG_USEC": "junk"}, 0},
	}
	for _, tt := range tests {
		if got := (&Notifier{Getenv: env(tt.env)}).WatchdogInterval(); got != tt.want {
			t.Errorf("WatchdogInterval(%v) = %v; want %v", tt.env, got, tt.want)
		}
	}
}

func TestListenersNotForUs(t *testing.T) {
	t.Parallel()
	for _, e := range []map[string]string{{}, {"LISTEN_PID": "1", "LISTEN_FDS": "2"}} {
		ls, err := (&Notifier{Getenv: env(e)}).Listeners()
		if ls != nil || err != nil {
			t.Errorf("Listeners(%v) = %v, %v; want nothing", e, ls, err)
		}
	}
	ls, err := (&Notifier{Getenv: env(map[string]string{"LISTEN_PID": strconv.Itoa(os.Getpid()), "LISTEN_FDS": "x"})}).Listeners()
	if err == nil {
		t.Errorf("bad LISTEN_FDS accepted: %v", ls)
	}
}
