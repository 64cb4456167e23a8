package reload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// Issue 25's failover defects, each against real servers: a split brain
// cuts its claimants' sessions, a role change cuts a node's sessions, a
// wrong-role answer acts at once, a held connection is served when its
// node comes back without a state change, a held connection's redials do
// not mark that node down, and max_lag sees a replica whose stream went
// silent.

// backendOf finds a backend of a service in r's running table.
func backendOf(t *testing.T, r *run, svc, name string) *backend.Backend {
	t.Helper()
	for _, tg := range r.srv.Snapshot().Service(svc).All() {
		if tg.B.Name == name {
			return tg.B
		}
	}
	t.Fatalf("no backend %s in %s", name, svc)
	return nil
}

// awaitState waits for a backend's state and returns how long it took;
// checks give no event but the state.
func awaitState(t *testing.T, r *run, svc, name string, want backend.State, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for deadline := start.Add(within); ; time.Sleep(5 * time.Millisecond) {
		st, role := backendOf(t, r, svc, name).State()
		if st == want {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			_, reason, _ := backendOf(t, r, svc, name).Health()
			t.Fatalf("%s/%s is %v (%s, %s) after %v; want %v", svc, name, st, role, reason, within, want)
		}
	}
}

// pgSession is a session through fulcrum to PostgreSQL that runs one long
// query, so that its end is seen the moment fulcrum cuts it.
type pgSession struct {
	c    *pgconn.PgConn
	port string        // the server it reached
	done chan struct{} // closed when the long query ended
	err  error         // why it ended; set before done closes
	at   time.Time     // when; set before done closes
}

func openPG(t *testing.T, addr string) *pgSession {
	t.Helper()
	c, err := pgconn.Connect(t.Context(), "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=10")
	if err != nil {
		t.Fatalf("connect through %s: %v", addr, err)
	}
	res, err := c.Exec(t.Context(), "SELECT inet_server_port()").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		c.Close(context.Background())
		t.Fatalf("query through %s: %v", addr, err)
	}
	s := &pgSession{c: c, port: string(res[0].Rows[0][0]), done: make(chan struct{})}
	t.Cleanup(func() {
		c.Conn().Close() // ends the long query, if it still runs: a PgConn is not for two goroutines at once
		<-s.done
		c.Close(context.Background())
	})
	go func() { // exits when the query ends: cut, or the test's cleanup closes c
		_, s.err = c.Exec(context.Background(), "SELECT pg_sleep(120)").ReadAll()
		s.at = time.Now()
		close(s.done)
	}()
	return s
}

// ended waits up to within for the session to end and returns when it did.
func (s *pgSession) ended(t *testing.T, what string, within time.Duration) time.Time {
	t.Helper()
	select {
	case <-s.done:
		return s.at
	case <-time.After(within):
		t.Fatalf("%s: still open %v later", what, within)
	}
	return time.Time{}
}

// alive reports whether the session is still open.
func (s *pgSession) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func pgHealth(svc, role string, interval time.Duration, fall int) string {
	return fmt.Sprintf("[services.%s.health]\ncheck = \"pgsql\"\nrole = %q\nuser = \"scramuser\"\npassword_file = \"pg.pw\"\n"+
		"interval = %q\ntimeout = %[3]q\nrise = 1\nfall = %d\n", svc, role, interval, fall)
}

func pgPassword(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pg.pw"), []byte(testkit.ScramPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// accessEnd waits for the access line of a session that ended through
// backend name, and returns its end. Connections that got no byte back are
// passed over: pgconn's CancelRequest, sent on its own connection when a
// session it was waiting on broke, is one.
func accessEnd(t *testing.T, r *run, name string) string {
	t.Helper()
	m := r.logs.Wait(t, 5*time.Second, "the access line of the session on "+name, func(m map[string]any) bool {
		return m["message"] == "connection" && m["backend"] == name && m["bytes_out"] != 0.0
	})
	return fmt.Sprint(m["end"])
}

// TestSplitBrainCutsRedis: the old master keeps its session while a
// replica is promoted (two masters, as after SENTINEL FAILOVER); as the
// split brain begins, fulcrum cuts that session, with on_down = "keep",
// within about a check interval, and its access line ends as "split
// brain".
func TestSplitBrainCutsRedis(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.StartRedis(t)
	b := testkit.StartRedis(t, "--replicaof", "127.0.0.1", port(a.Addr))
	const interval = 200 * time.Millisecond
	health := fmt.Sprintf("[services.rw.health]\ncheck = \"redis\"\nrole = \"primary\"\ninterval = %q\ntimeout = %[1]q\nrise = 1\nfall = 3\n", interval)
	r := startRun(t, t.TempDir(), render(svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: "on_down = \"keep\"\nsplit_brain = \"refuse\"\n" + health, backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}}))
	awaitState(t, r, "rw", "a", backend.StateUp, 10*time.Second)
	awaitState(t, r, "rw", "b", backend.StateWrongRole, 10*time.Second)
	c, err := net.Dial("tcp", r.addr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "INFO replication\r\n")
	rd := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var n int
	if _, err := fmt.Fscanf(rd, "$%d\r\n", &n); err != nil {
		t.Fatalf("INFO through rw: %v", err)
	}
	info := make([]byte, n+2) // the whole reply, so that nothing is left to read but the end
	if _, err := io.ReadFull(rd, info); err != nil || !strings.Contains(string(info), "role:master") {
		t.Fatalf("INFO through rw: %q, %v; want the master's", info, err)
	}

	b.Do(t, "REPLICAOF NO ONE") // two masters now
	promoted := time.Now()
	r.logs.Wait(t, 10*time.Second, "the split", func(m map[string]any) bool {
		return m["message"] != nil && strings.HasPrefix(m["message"].(string), "split brain: more than one")
	})
	seen := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rd.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the session on the old master is still open 5s after the split brain began")
	}
	cut := time.Now()
	t.Logf("split brain seen %v after REPLICAOF NO ONE; the session on a ended %v after that",
		seen.Sub(promoted).Round(time.Millisecond), cut.Sub(seen).Round(time.Millisecond))
	if limit := 2*interval + 2*time.Second; cut.Sub(promoted) > limit {
		t.Errorf("the session on a ended %v after the promotion; want within about a check interval (%v), with a busy machine's margin %v", cut.Sub(promoted), interval, limit)
	}
	if end := accessEnd(t, r, "a"); end != backend.CutSplitBrain {
		t.Errorf("the session's end = %q; want %q", end, backend.CutSplitBrain)
	}
	r.logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (split brain)" && m["backend"] == "a"
	})
}

// TestSplitBrainCutsPostgres: a replica is promoted while the old primary
// runs on. With split_brain = "refuse" the session on the old primary is
// cut and nothing new reaches either; with "newest" the session on the
// old primary is cut and new connections reach the promoted node, the one
// on the higher timeline; a second promotion of another replica to the
// same timeline is a tie, which refuses and cuts the writer's sessions.
func TestSplitBrainCutsPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two or three PostgreSQL servers")
	}
	for _, mode := range []string{"refuse", "newest"} {
		t.Run(mode, func(t *testing.T) {
			testkit.DeadAddr(t) // the runtime's network poller opens two descriptors on first use: before CheckLeaks counts
			testkit.CheckLeaks(t)
			a := testkit.StartPostgres(t)
			b := a.Replica(t)
			bes := []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}
			var c *testkit.Postgres
			if mode == "newest" {
				c = a.Replica(t)
				bes = append(bes, be{"c", c.Addr, 1, ""})
			}
			const interval = 500 * time.Millisecond
			r := startRun(t, pgPassword(t), render(svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first",
				extra:    fmt.Sprintf("on_down = \"keep\"\nsplit_brain = %q\n", mode) + pgHealth("rw", "primary", interval, 3),
				backends: bes}))
			rw := r.addr("127.0.0.1:0")
			awaitState(t, r, "rw", "a", backend.StateUp, 10*time.Second)
			awaitState(t, r, "rw", "b", backend.StateWrongRole, 10*time.Second)
			old := openPG(t, rw)
			if old.port != fmt.Sprint(a.Port) {
				t.Fatalf("rw reached port %s; want a (%d)", old.port, a.Port)
			}

			b.Promote(t) // a runs on: two primaries
			promoted := time.Now()
			at := old.ended(t, "the session on the old primary", 10*time.Second)
			t.Logf("split brain (%s): the session on the old primary ended %v after pg_ctl promote returned (%v)",
				mode, at.Sub(promoted).Round(time.Millisecond), old.err)
			if limit := 2*interval + 2*time.Second; at.Sub(promoted) > limit {
				t.Errorf("the session on a ended %v after the promotion; want within %v", at.Sub(promoted), limit)
			}
			if end := accessEnd(t, r, "a"); end != backend.CutSplitBrain {
				t.Errorf("the session's end = %q; want %q", end, backend.CutSplitBrain)
			}
			s := r.srv.Snapshot().Service("rw")
			switch mode {
			case "refuse":
				if s.SplitWriter != "" {
					t.Errorf("split_brain = refuse kept %s as the writer", s.SplitWriter)
				}
				if _, err := pgconn.Connect(t.Context(), "postgres://postgres@"+rw+"/postgres?sslmode=disable&connect_timeout=5"); err == nil {
					t.Error("a new connection during the split brain got through")
				}
				return
			case "newest":
				if ta, tb := backendOf(t, r, "rw", "a").Timeline(), backendOf(t, r, "rw", "b").Timeline(); s.SplitWriter != "b" || tb <= ta {
					t.Fatalf("writer %q, timelines a %d, b %d; want b, on the higher", s.SplitWriter, ta, tb)
				}
			}
			w := openPG(t, rw)
			if w.port != fmt.Sprint(b.Port) {
				t.Fatalf("with split_brain = newest a new session reached port %s; want b (%d)", w.port, b.Port)
			}
			// c, promoted too, reaches the same timeline as b: a tie.
			c.Promote(t)
			w.ended(t, "the session on b after c reached its timeline", 10*time.Second)
			if end := accessEnd(t, r, "b"); end != backend.CutSplitBrain {
				t.Errorf("b's session's end = %q; want %q", end, backend.CutSplitBrain)
			}
			if s := r.srv.Snapshot().Service("rw"); s.SplitWriter != "" || len(s.SplitBrain) != 3 {
				t.Errorf("after the tie: claimants %v, writer %q; want a, b, c and none", s.SplitBrain, s.SplitWriter)
			}
		})
	}
}

// TestRoleChangeCutsReader: a reader's session on a replica that is then
// promoted is cut (on_role_change's default, close) although on_down is
// keep, and ends as "role change"; a service with on_role_change = "keep"
// keeps its own. The promoted replica leaves the replica pool on its
// first answer as primary, not after fall answers.
func TestRoleChangeCutsReader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers")
	}
	testkit.DeadAddr(t) // the runtime's network poller opens two descriptors on first use: before CheckLeaks counts
	testkit.CheckLeaks(t)
	a := testkit.StartPostgres(t)
	b := a.Replica(t)
	// fall × interval (30 s) stays above the waits' margin: a node seen
	// wrong role only after fall answers would fail the limit below. The
	// 30 s waits are margins for checks that time out on a busy 2-core
	// machine under -race, not a promise of fulcrum's.
	const interval, fall = 500 * time.Millisecond, 60
	r := startRun(t, pgPassword(t), render(
		svc{name: "ro", listen: []string{"127.0.0.1:0"}, scheduler: "first", extra: pgHealth("ro", "replica", interval, fall),
			backends: []be{{"b", b.Addr, 1, ""}, {"a", a.Addr, 1, ""}}},
		svc{name: "rokeep", listen: []string{"127.0.0.2:0"}, scheduler: "first", extra: "on_role_change = \"keep\"\n" + pgHealth("rokeep", "replica", interval, fall),
			backends: []be{{"b", b.Addr, 1, ""}, {"a", a.Addr, 1, ""}}}))
	awaitState(t, r, "ro", "b", backend.StateUp, 10*time.Second)
	awaitState(t, r, "rokeep", "b", backend.StateUp, 10*time.Second)
	cut, kept := openPG(t, r.addr("127.0.0.1:0")), openPG(t, r.addr("127.0.0.2:0"))
	if want := fmt.Sprint(b.Port); cut.port != want || kept.port != want {
		t.Fatalf("readers reached ports %s and %s; want the replica's %s", cut.port, kept.port, want)
	}

	b.Promote(t)
	promoted := time.Now()
	took := awaitState(t, r, "ro", "b", backend.StateWrongRole, 30*time.Second)
	t.Logf("the promoted node was wrong role in ro %v after pg_ctl promote returned (interval %v, fall %d)", took.Round(time.Millisecond), interval, fall)
	if limit := time.Duration(fall) * interval * 9 / 10; took >= limit {
		t.Errorf("wrong role after %v; want on the first answer, well within fall × interval (%v)", took, limit)
	}
	at := cut.ended(t, "the reader on the promoted node", 10*time.Second)
	t.Logf("its reader's session ended %v after the promotion", at.Sub(promoted).Round(time.Millisecond))
	if end := accessEnd(t, r, "b"); end != backend.CutRoleChange {
		t.Errorf("the reader's end = %q; want %q", end, backend.CutRoleChange)
	}
	r.logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (on_role_change = close)" && m["service"] == "ro" && m["backend"] == "b"
	})
	r.logs.Wait(t, 30*time.Second, "rokeep's wrong role", func(m map[string]any) bool {
		return m["message"] == "backend in the wrong role" && m["service"] == "rokeep" && m["backend"] == "b"
	})
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // a cut would follow the line at once
		if !kept.alive() {
			t.Fatalf("on_role_change = keep: the reader's session ended: %v", kept.err)
		}
	}
}

// TestHeldServedWithinFall: a node that stops listening and comes back
// within fall × interval never changes state; a connection held after its
// dial failed meanwhile is served as soon as a check passes, not reset
// when hold_timeout runs out.
func TestHeldServedWithinFall(t *testing.T) {
	testkit.CheckLeaks(t)
	addr := testkit.FreeAddr(t)
	srv := testkit.NewServerAt(t, addr, testkit.Greeter("b"))
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 1\nfall = 50\n"
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: "hold_timeout = \"10s\"\n" + health, backends: []be{{"b", addr, 1, ""}}}))
	if name, err := testkit.Greeting(r.addr("127.0.0.1:0")); name != "b" {
		t.Fatalf("before the outage: %q, %v", name, err)
	}
	srv.Close() // refuses from now on
	c, err := net.Dial("tcp", r.addr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r.logs.Wait(t, 5*time.Second, "the refused dial", func(m map[string]any) bool {
		return m["message"] == "connect failed" && m["backend"] == "b"
	})
	back := time.Now()
	testkit.NewServerAt(t, addr, testkit.Greeter("b"))
	c.SetReadDeadline(time.Now().Add(8 * time.Second)) // hold_timeout is 10s
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "b\n" {
		t.Fatalf("the held connection: %q, %v; want served once the node is back", line, err)
	}
	t.Logf("the held connection was served %v after the node listened again", time.Since(back).Round(time.Millisecond))
	if st, _ := backendOf(t, r, "s", "b").State(); st != backend.StateUp || len(r.logs.All(backendLine("backend down", "b"))) > 0 {
		t.Errorf("the node changed state (%v): the test wants one back within fall × interval", st)
	}
}

// TestHeldRedialsNotPassive: a node whose checks pass (on another port, as
// Patroni's REST API) while its service port refuses: a held connection
// redials it at every passing check, and those redials do not mark it
// down by passive failures (max_fails = 3), so that when it listens again
// the held connection is served at once instead of after fail_timeout.
func TestHeldRedialsNotPassive(t *testing.T) {
	testkit.CheckLeaks(t)
	addr := testkit.FreeAddr(t)
	host, _, _ := net.SplitHostPort(addr)
	check := testkit.NewServerAt(t, host+":0", testkit.Greeter("check"))
	_, checkPort, _ := net.SplitHostPort(check.Addr)
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 1\nfall = 5\n"
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: "hold_timeout = \"10s\"\nmax_fails = 3\nfail_timeout = \"10s\"\n" + health, backends: []be{{"b", addr, 1, "health = { port = " + checkPort + " }"}}}))
	awaitState(t, r, "s", "b", backend.StateUp, 5*time.Second)
	c, err := net.Dial("tcp", r.addr("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := backendOf(t, r, "s", "b")
	for deadline := time.Now().Add(10 * time.Second); b.Stats().ConnectFails < 6; time.Sleep(10 * time.Millisecond) { // redials give no event but the count
		if time.Now().After(deadline) {
			t.Fatalf("%d failed dials in 10s; want the held connection to redial at every passing check", b.Stats().ConnectFails)
		}
	}
	if st, _ := b.State(); st != backend.StateUp {
		_, reason, _ := b.Health()
		t.Fatalf("after %d refused dials, all but one by a held connection, b is %v (%s); want up", b.Stats().ConnectFails, st, reason)
	}
	back := time.Now()
	testkit.NewServerAt(t, addr, testkit.Greeter("b"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "b\n" {
		t.Fatalf("the held connection: %q, %v; want served once the node is back", line, err)
	}
	t.Logf("%d redials uncounted; the held connection was served %v after the node listened again",
		b.Stats().ConnectFails-1, time.Since(back).Round(time.Millisecond))
}

// TestMaxLagSilentStream: a replica whose WAL stream is stalled (the
// primary's walsender stopped with SIGSTOP: the replica's walreceiver
// still says streaming and has replayed all it received) while the primary
// writes goes down under max_lag, measured against the primary's position;
// a replica of an idle primary stays up however old its last transaction,
// the stalled one comes back once the stream moves again; one left behind
// without an upstream is down while the primary writes, and back once the
// primary is dead (unseen for max_lag).
func TestMaxLagSilentStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers")
	}
	testkit.DeadAddr(t) // the runtime's network poller opens two descriptors on first use: before CheckLeaks counts
	testkit.CheckLeaks(t)
	a := testkit.StartPostgres(t)
	b := a.Replica(t)
	a.Exec(t, "CREATE TABLE w (x int)")
	const maxLag = 2 * time.Second
	r := startRun(t, pgPassword(t), render(svc{name: "ro", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra:    pgHealth("ro", "replica", 500*time.Millisecond, 3) + fmt.Sprintf("max_lag = %q\n", maxLag),
		backends: []be{{"b", b.Addr, 1, ""}, {"a", a.Addr, 1, ""}}}))
	awaitState(t, r, "ro", "b", backend.StateUp, 20*time.Second)
	rb := backendOf(t, r, "ro", "b")
	for end := time.Now().Add(2 * maxLag); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // an idle primary, watched for twice max_lag
		if st, _ := rb.State(); st != backend.StateUp {
			_, reason, _ := rb.Health()
			t.Fatalf("the replica of an idle primary went %v (%s)", st, reason)
		}
	}

	pid := a.Exec(t, "SELECT pid FROM pg_stat_replication")
	if len(pid) != 1 {
		t.Fatalf("pg_stat_replication: %v; want one walsender", pid)
	}
	if out, err := exec.Command("kill", "-STOP", pid[0][0]).CombinedOutput(); err != nil {
		t.Fatalf("kill -STOP %s: %v %s", pid[0][0], err, out)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			exec.Command("kill", "-CONT", pid[0][0]).Run()
		}
	}
	t.Cleanup(resume) // a stopped walsender would hold the primary's shutdown
	ctx, cancel := context.WithCancel(context.Background())
	writes := make(chan struct{})
	go func() { // exits when cancel ends ctx
		defer close(writes)
		c, err := pgconn.Connect(ctx, "postgres://postgres@"+a.Addr+"/postgres?sslmode=disable")
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		for ctx.Err() == nil {
			c.Exec(ctx, "INSERT INTO w VALUES (1)").ReadAll()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond): // a writer's pace
			}
		}
	}()
	defer func() { cancel(); <-writes }()
	took := awaitState(t, r, "ro", "b", backend.StateDown, maxLag+10*time.Second)
	_, reason, _ := rb.Health()
	t.Logf("stalled stream: the replica went down %v after the walsender stopped (max_lag %v): %s", took.Round(time.Millisecond), maxLag, reason)
	if !strings.Contains(reason, "over max_lag") {
		t.Errorf("reason = %q; want over max_lag", reason)
	}
	if st := b.Exec(t, "SELECT status FROM pg_stat_wal_receiver"); len(st) != 1 || st[0][0] != "streaming" {
		t.Logf("walreceiver status %v (the drill saw streaming)", st)
	}
	resume()
	awaitState(t, r, "ro", "b", backend.StateUp, 20*time.Second)

	// The replica's stream is cut on its side (no upstream: receive =
	// replay) while the primary writes: behind by the clock. Then the
	// primary dies: once it has not been seen for max_lag it measures
	// nothing, and the replica, the freshest copy left, is back in the
	// pool by its own view.
	b.Exec(t, "ALTER SYSTEM SET primary_conninfo = ''")
	b.Exec(t, "SELECT pg_reload_conf()")
	awaitState(t, r, "ro", "b", backend.StateDown, maxLag+10*time.Second)
	cancel()
	<-writes
	a.Stop(t, "immediate")
	died := time.Now()
	took = awaitState(t, r, "ro", "b", backend.StateUp, maxLag+10*time.Second)
	t.Logf("primary dead: the replica it had left behind was back in the pool %v later", took.Round(time.Millisecond))
	if d := time.Since(died); d < maxLag/2 {
		t.Errorf("the replica was back %v after the primary died; want once the primary was unseen for about max_lag (%v)", d, maxLag)
	}
}
