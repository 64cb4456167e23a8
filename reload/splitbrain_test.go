package reload

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
	"fulcrum/sched"
)

// The split brain: reload's table writer finds the services where more
// than one backend claims the primary role, and publishes the table that
// refuses (or picks the first) while it lasts.

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// TestSplitBrain: two Redis masters behind a role = "primary" service. With
// split_brain = "refuse" nothing is eligible while both claim primary; with
// "first" only the first in file order is. The split is logged once as it
// begins and once as it ends, when one becomes a replica.
func TestSplitBrain(t *testing.T) {
	for _, mode := range []string{"refuse", "first"} {
		t.Run(mode, func(t *testing.T) {
			a, b := testkit.StartRedis(t), testkit.StartRedis(t)
			// fall = 3: one check slower than its 100 ms timeout on a busy
			// machine must not mark a down between the split and the pick.
			health := "[services.rw.health]\ncheck = \"redis\"\nrole = \"primary\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 3\n"
			r := startRun(t, t.TempDir(), render(svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first",
				extra:    fmt.Sprintf("split_brain = %q\n", mode) + health,
				backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}}))
			r.logs.Wait(t, 10*time.Second, "the split", func(m map[string]any) bool {
				return m["message"] != nil && strings.HasPrefix(m["message"].(string), "split brain: more than one") && m["backends"] == "a, b"
			})
			snap := r.srv.Snapshot()
			s := snap.Service("rw")
			if refuse := s.SplitWriter == ""; len(s.SplitBrain) != 2 || refuse != (mode == "refuse") {
				t.Fatalf("SplitBrain = %v, writer %q", s.SplitBrain, s.SplitWriter)
			}
			var req sched.Request
			i, err := s.Picker.Pick(&req)
			switch {
			case mode == "refuse" && err == nil:
				t.Errorf("split_brain = refuse: picked %s", s.Targets[i].B.Name)
			case mode == "first" && (err != nil || s.Targets[i].B.Name != "a"):
				t.Errorf("split_brain = first: Pick = %d, %v; want a", i, err)
			}
			if g := r.admission("rw"); g.Splits != 1 {
				t.Errorf("Splits = %d; want 1", g.Splits)
			}
			a.Do(t, "REPLICAOF 127.0.0.1 "+port(b.Addr))
			r.logs.Wait(t, 10*time.Second, "the end of the split", func(m map[string]any) bool {
				return m["message"] == "split brain over: at most one backend claims the primary role"
			})
			s = r.srv.Snapshot().Service("rw")
			if i, err := s.Picker.Pick(&req); err != nil || s.Targets[i].B.Name != "b" {
				t.Errorf("after a became a replica: Pick = %d, %v; want b", i, err)
			}
			if n := len(r.logs.All(func(m map[string]any) bool {
				return m["message"] != nil && strings.HasPrefix(m["message"].(string), "split brain: more than one")
			})); n != 1 {
				t.Errorf("the split was logged %d times; want once", n)
			}
		})
	}
}

// redisSplit runs rw (split_brain's default, refuse) over two Redis
// masters a and b, checked every interval (timeout 100ms) with fall, and
// waits for the split; it returns the run and b.
func redisSplit(t *testing.T, interval string, fall int) (*run, *testkit.Redis) {
	t.Helper()
	a, b := testkit.StartRedis(t), testkit.StartRedis(t)
	health := fmt.Sprintf("[services.rw.health]\ncheck = \"redis\"\nrole = \"primary\"\ninterval = %q\ntimeout = \"100ms\"\nrise = 1\nfall = %d\n", interval, fall)
	r := startRun(t, t.TempDir(), render(svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: "hold_timeout = \"5s\"\n" + health, backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}}))
	r.logs.Wait(t, 10*time.Second, "the split", func(m map[string]any) bool {
		return m["message"] != nil && strings.HasPrefix(m["message"].(string), "split brain: more than one")
	})
	return r, b
}

// refusedInSplit opens a connection through rw and fails the test unless
// it is closed without reaching either of s's backends.
func refusedInSplit(t *testing.T, r *run, s *sched.Service, when string) {
	t.Helper()
	ta, tb := s.Targets[0].B, s.Targets[1].B
	before := ta.Stats().Total + tb.Stats().Total
	c, err := net.Dial("tcp", r.addr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("a connection %s read %d bytes; want it closed", when, n)
	}
	if after := ta.Stats().Total + tb.Stats().Total; after != before {
		t.Errorf("%d connections reached a claimant %s", after-before, when)
	}
}

// TestSplitBrainRefuses: while two Redis masters claim primary, a new
// connection is closed before any backend is dialled, and counted.
func TestSplitBrainRefuses(t *testing.T) {
	testkit.CheckLeaks(t)
	r, _ := redisSplit(t, "100ms", 1)
	s := r.srv.Snapshot().Service("rw")
	refusedInSplit(t, r, s, "during the split")
	if n := r.admission("rw").Rejected[listener.RejectSplitBrain.String()]; n != 1 {
		t.Errorf("rejected for split brain: %d; want 1", n)
	}
	if n := len(r.logs.All(func(m map[string]any) bool { return m["message"] == "connection rejected" })); n != 0 {
		t.Errorf("%d per-connection rejection lines; the split is logged once, as it begins", n)
	}
}

// TestSplitBrainOutlastsFailedCheck: a claimant whose check times out,
// fewer than fall times, is still up and picked, and still claims the
// primary role as it last answered: a rebuild of the table meanwhile (any
// health change elsewhere makes one) keeps the split brain, and a new
// connection is still refused, not sent to the claimant that answered.
func TestSplitBrainOutlastsFailedCheck(t *testing.T) {
	testkit.CheckLeaks(t)
	r, b := redisSplit(t, "200ms", 100)
	s := r.srv.Snapshot().Service("rw")
	tb := s.Targets[1].B
	if got := b.Do(t, "CLIENT PAUSE 20000 ALL"); got != "+OK" { // b's checks time out; fall = 100 keeps it up for 20 s
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	defer b.Kill()                                    // a paused server answers nothing more; its cleanup kills it anyway
	testkit.WaitFor(t, 15*time.Second, func() error { // checks give no event but the state
		if st, role := tb.State(); st != backend.StateUp || role != "" {
			return fmt.Errorf("backend b: %v (%q) after its pause; want up with a failed check (no role)", st, role)
		}
		return nil
	})
	r.m.refresh() // the rebuild a health change elsewhere makes
	if s = r.srv.Snapshot().Service("rw"); len(s.SplitBrain) != 2 {
		t.Errorf("after a failed check of b (still up), the split brain is %v; want a, b", s.SplitBrain)
	}
	refusedInSplit(t, r, s, "while b's check fails (b still up)")
}
