package reload

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
	"fulcrum/sched"
)

// redisRole asks, over c, what role the Redis behind it has.
func redisRole(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "AUTH redis-pw\r\nINFO replication\r\n")
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("INFO through fulcrum: %v", err)
		}
		if role, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return role
		}
	}
}

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// TestRolesRedis: a role = "primary" service with scheduler first and
// on_down = "close", and a role = "replica" service, over a Redis primary
// and its replica. Each service shows the other node as wrong role;
// REPLICAOF NO ONE and the old primary turned replica move the roles
// within fall × interval + 1s; the session open on the old primary is
// cut, and new connections reach the new primary.
func TestRolesRedis(t *testing.T) {
	testkit.CheckLeaks(t)
	auth := []string{"--requirepass", "redis-pw", "--masterauth", "redis-pw"}
	a := testkit.StartRedis(t, auth...)
	b := testkit.StartRedis(t, append(auth, "--replicaof", "127.0.0.1", port(a.Addr))...)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "redis.pw"), []byte("redis-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const interval, fall, rise = 200 * time.Millisecond, 2, 1
	health := func(svc, role string) string {
		return fmt.Sprintf("[services.%s.health]\ncheck = \"redis\"\nrole = %q\npassword_file = \"redis.pw\"\ninterval = %q\ntimeout = %q\nrise = %d\nfall = %d\n",
			svc, role, interval, interval, rise, fall)
	}
	r := startRun(t, dir, render(
		svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first", extra: "on_down = \"close\"\n" + health("rw", "primary"),
			backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}},
		svc{name: "ro", listen: []string{"127.0.0.2:0"}, scheduler: "rr", extra: health("ro", "replica"),
			backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}}))
	rw, ro := r.addr("127.0.0.1:0"), r.addr("127.0.0.2:0")
	state := func(svc, name string) (backend.State, string) {
		for _, tg := range r.srv.Snapshot().Service(svc).All() {
			if tg.B.Name == name {
				return tg.B.State()
			}
		}
		t.Fatalf("no backend %s in %s", name, svc)
		return 0, ""
	}
	waitState := func(svc, name string, want backend.State, role string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(within); ; time.Sleep(10 * time.Millisecond) { // checks give no event but the state
			st, got := state(svc, name)
			if st == want && got == role {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s/%s = %v (%s) after %v; want %v (%s)", svc, name, st, got, within, want, role)
			}
		}
	}
	waitState("rw", "a", backend.StateUp, "primary", 10*time.Second)
	waitState("rw", "b", backend.StateWrongRole, "replica", 10*time.Second)
	waitState("ro", "b", backend.StateUp, "replica", 10*time.Second)
	waitState("ro", "a", backend.StateWrongRole, "primary", 10*time.Second)

	old, err := net.Dial("tcp", rw)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if role := redisRole(t, old); role != "master" {
		t.Fatalf("rw reached a %s; want the master", role)
	}
	c, _ := net.Dial("tcp", ro)
	if role := redisRole(t, c); role != "slave" {
		t.Errorf("ro reached a %s; want the replica", role)
	}
	c.Close()

	// Fail over: b becomes the master, a its replica.
	b.Do(t, "AUTH redis-pw\r\nREPLICAOF NO ONE")
	a.Do(t, "AUTH redis-pw\r\nREPLICAOF 127.0.0.1 "+port(b.Addr))
	moved := time.Now()
	waitState("rw", "a", backend.StateWrongRole, "replica", 10*time.Second)
	if d, limit := time.Since(moved), fall*interval+time.Second; d > limit {
		t.Errorf("the old master left rw %v after REPLICAOF; want within %v", d, limit)
	}
	r.logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		// By the split brain, when b's promotion is seen before a's
		// demotion; else by on_role_change (the default), which comes
		// before on_down.
		return (m["message"] == "sessions cut (on_role_change = close)" || m["message"] == "sessions cut (split brain)") && m["backend"] == "a"
	})
	old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := old.Read(make([]byte, 1)); err == nil {
		t.Errorf("the session on the old master is still open (read %d bytes)", n)
	}
	waitState("rw", "b", backend.StateUp, "primary", 10*time.Second)
	c, _ = net.Dial("tcp", rw)
	if role := redisRole(t, c); role != "master" {
		t.Errorf("after the failover rw reached a %s; want the new master", role)
	}
	c.Close()
	r.logs.Wait(t, 5*time.Second, "the wrong-role log line", func(m map[string]any) bool {
		return m["message"] == "backend in the wrong role" && m["backend"] == "a" && m["service"] == "rw" && m["role"] == "replica"
	})
	if s := r.srv.Snapshot().Service("rw").Targets[0].B.Stats(); s.CutClosed != 1 {
		t.Errorf("a's CutClosed = %d; want 1", s.CutClosed)
	}
}

// TestOnUpCloseBackups: with on_up = "close-backups", a session on the
// backup ends when the primary comes back, and the next connection goes
// to the primary.
func TestOnUpCloseBackups(t *testing.T) {
	testkit.CheckLeaks(t)
	h := &testkit.Holder{}
	bk := testkit.NewServer(t, h.Handle)
	primary := testkit.DeadAddr(t)
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra:    "on_up = \"close-backups\"\n" + health,
		backends: []be{{"p", primary, 1, ""}, {"bk", bk.Addr, 1, "backup = true"}}}))
	addr := r.addr("127.0.0.1:0")
	r.logs.Wait(t, 5*time.Second, "p down", backendLine("backend down", "p"))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); got != "in\n" {
		t.Fatalf("via the backup: %q, %v", got, err)
	}
	testkit.NewServerAt(t, primary, testkit.Greeter("p"))
	r.logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (on_up = close-backups)" && m["backend"] == "bk"
	})
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("the session on the backup is still open (read %d bytes)", n)
	}
	if name, err := testkit.Greeting(addr); name != "p" {
		t.Errorf("after p came back: %q, %v; want p", name, err)
	}
}

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

// TestFallback: a service whose own backends are all down picks from its
// fallback's, and returns to its own as soon as one is up.
func TestFallback(t *testing.T) {
	testkit.CheckLeaks(t)
	w := testkit.NewServer(t, testkit.Greeter("writer"))
	replica := testkit.DeadAddr(t)
	health := func(s string) string {
		return "[services." + s + ".health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	}
	r := startRun(t, t.TempDir(), render(
		svc{name: "ro", listen: []string{"127.0.0.1:0"}, extra: "fallback = \"rw\"\n" + health("ro"), backends: []be{{"r", replica, 1, ""}}},
		svc{name: "rw", listen: []string{"127.0.0.2:0"}, extra: health("rw"), backends: []be{{"w", w.Addr, 1, ""}}}))
	ro := r.addr("127.0.0.1:0")
	r.logs.Wait(t, 5*time.Second, "r down", backendLine("backend down", "r"))
	if name, err := testkit.Greeting(ro); name != "writer" {
		t.Errorf("ro with its replica down: %q, %v; want the writer", name, err)
	}
	testkit.NewServerAt(t, replica, testkit.Greeter("replica"))
	r.logs.Wait(t, 5*time.Second, "r up", backendLine("backend up", "r"))
	if name, err := testkit.Greeting(ro); name != "replica" {
		t.Errorf("ro with its replica back: %q, %v; want the replica", name, err)
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
	defer b.Kill()                                                                         // a paused server answers nothing more; its cleanup kills it anyway
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(5 * time.Millisecond) { // checks give no event but the state
		st, role := tb.State()
		if st == backend.StateUp && role == "" {
			break // a check of b failed, and b is still up
		}
		if time.Now().After(deadline) {
			t.Fatalf("b is %v (%q) 15 s after its pause; want up with a failed check", st, role)
		}
	}
	r.m.refresh() // the rebuild a health change elsewhere makes
	if s = r.srv.Snapshot().Service("rw"); len(s.SplitBrain) != 2 {
		t.Errorf("after a failed check of b (still up), the split brain is %v; want a, b", s.SplitBrain)
	}
	refusedInSplit(t, r, s, "while b's check fails (b still up)")
}

// TestOnDownPassive: on_down = "close" cuts a backend's sessions when
// passive failures (a refused dial) mark it down, not only a failed check.
func TestOnDownPassive(t *testing.T) {
	testkit.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 1)
	go func() { // exits when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("a\n"))
			held <- c
		}
	}()
	b := testkit.NewServer(t, testkit.Greeter("b"))
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra:    "on_down = \"close\"\nmax_fails = 1\nretries = 1\n",
		backends: []be{{"a", ln.Addr().String(), 1, ""}, {"b", b.Addr, 1, ""}}}))
	front := r.addr("127.0.0.1:0")
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if s, err := br.ReadString('\n'); s != "a\n" {
		t.Fatalf("first connection: %q, %v; want a", s, err)
	}
	server := <-held
	defer server.Close()
	ln.Close() // a refuses new connections; its open session stays
	if name, err := testkit.Greeting(front); name != "b" {
		t.Errorf("after a refused: %q, %v; want b", name, err)
	}
	r.logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (on_down = close)" && m["backend"] == "a" && m["reason"] == "backend down"
	})
	if n, err := br.ReadByte(); err == nil {
		t.Errorf("the session on a is still open (read %q)", n)
	}
}

// TestRolesMariaDB: SET GLOBAL read_only moves a MariaDB node out of a
// role = "primary" service within fall × interval + 1s (its session cut
// with on_down = "close"), and back in when cleared.
func TestRolesMariaDB(t *testing.T) {
	testkit.CheckLeaks(t)
	m := testkit.StartMariaDB(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "my.pw"), []byte(testkit.MD5Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const interval, fall = 300 * time.Millisecond, 2
	health := fmt.Sprintf("[services.my.health]\ncheck = \"mysql\"\nrole = \"primary\"\nuser = \"checker\"\npassword_file = \"my.pw\"\n"+
		"interval = %q\ntimeout = %q\nrise = 1\nfall = %d\n", interval, interval, fall)
	r := startRun(t, dir, render(svc{name: "my", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: "on_down = \"close\"\n" + health, backends: []be{{"m", m.Addr, 1, ""}}}))
	b := r.srv.Snapshot().Service("my").Targets[0].B
	wait := func(want backend.State) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // checks give no event but the state
			if st, _ := b.State(); st == want {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				st, role := b.State()
				t.Fatalf("m is %v (%s); want %v", st, role, want)
			}
		}
	}
	wait(backend.StateUp)
	c, err := net.Dial("tcp", r.addr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil { // the server's greeting, through fulcrum
		t.Fatalf("no greeting through fulcrum: %v", err)
	}
	m.Exec(t, "SET GLOBAL read_only = 1")
	if d, limit := wait(backend.StateWrongRole), fall*interval+time.Second; d > limit {
		t.Errorf("read_only took m out after %v; want within %v", d, limit)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			break // cut (the greeting's rest, if any, read first)
		}
	}
	if s := b.Stats(); s.CutClosed != 1 {
		t.Errorf("CutClosed = %d; want 1", s.CutClosed)
	}
	m.Exec(t, "SET GLOBAL read_only = 0")
	wait(backend.StateUp)
}
