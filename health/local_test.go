package health

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// TestChecksIgnoreLocalErrors: an active check that fails for want of
// fulcrum's own resources (no descriptor: EMFILE; no local port or address:
// EADDRNOTAVAIL) is not held against the backend, even with fall = 1: the
// backend stays up, no failed check is counted, and the last check says why
// it was not counted. A check that reaches a closed port still fails.
// Before, port exhaustion marked a healthy backend down (issue 30).
func TestChecksIgnoreLocalErrors(t *testing.T) {
	live := testkit.NewServer(t, testkit.Echo).Addr
	for _, c := range []struct {
		name   string
		dialer *net.Dialer
		want   string
	}{
		{"EMFILE", &net.Dialer{Control: func(string, string, syscall.RawConn) error { return syscall.EMFILE }}, "too many open files"},
		{"EADDRNOTAVAIL", &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("192.0.2.1")}}, "cannot assign requested address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p backend.Pool
			b := p.Get("s", c.name)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { // exits when cancel is called
				defer close(done)
				RunChecks(ctx, b, CheckSpec{Probe: Probe{Kind: CheckTCP, Addr: live, Timeout: time.Second, dialer: c.dialer},
					Interval: 10 * time.Millisecond, Rise: 1, Fall: 1})
			}()
			defer func() { cancel(); <-done }()
			testkit.WaitFor(t, 10*time.Second, func() error { // the checks run on their own; no event but the result
				if last := b.Checks().Last; !strings.Contains(last.Err, "not counted, fulcrum's own resources: ") || !strings.Contains(last.Err, c.want) {
					return fmt.Errorf("last check %+v; want one not counted for %s", last, c.want)
				}
				return nil
			})
			// Ten more probes, each not counted, with fall = 1: awaited by
			// the last result's time, which each probe sets.
			seen, last := 0, b.Checks().Last.At
			testkit.WaitFor(t, 10*time.Second, func() error {
				if at := b.Checks().Last.At; !at.Equal(last) {
					seen, last = seen+1, at
				}
				if seen < 10 {
					return fmt.Errorf("%d more probes; want 10", seen)
				}
				return nil
			})
			if b.Down() || b.Checks().Failed != 0 {
				_, reason, _ := b.Health()
				t.Errorf("down %v (%s), %d failed checks; want up and none counted", b.Down(), reason, b.Checks().Failed)
			}
		})
	}
	t.Run("a real failure still counts", func(t *testing.T) {
		var p backend.Pool
		b := p.Get("s", "dead")
		pr := Probe{Kind: CheckTCP, Addr: testkit.DeadAddr(t), Timeout: time.Second}
		start := time.Now()
		a, err := pr.Ask(context.Background())
		if err == nil || LocalError(err) {
			t.Fatalf("Check on a closed port = %v; want a backend's failure", err)
		}
		b.Checked(pr.result(start, a, err), 1, 1)
		if !b.Down() {
			t.Errorf("not down after a refused connect with fall 1: %v", err)
		}
	})
}
