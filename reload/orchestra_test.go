package reload

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fulcrum/internal/testkit"
)

// The orchestrated drill (issue 25): fulcrum in front of a real Patroni
// cluster and a real Redis Sentinel set, with the checks that know who the
// leader is (patroni_port; sentinels and master_name). One writer keeps a
// session open through fulcrum's writer service and writes 20 times a
// second, reconnecting after any error; a reader keeps a session on the
// replica service. Every acknowledged write is recorded, and at the end
// each one must be on the final primary.
//
// The normal run has one PostgreSQL scenario (kill -9 of the leader's
// Patroni, the one the database alone gets wrong) and one Redis scenario
// (SENTINEL FAILOVER); FULCRUM_DRILL=1 (set by .ci/run) runs them all.

// drillFull reports whether the whole drill runs.
func drillFull() bool { return os.Getenv("FULCRUM_DRILL") == "1" }

// wrec is what the clients and the monitor saw, for one scenario.
type wrec struct {
	mu      sync.Mutex // protects the fields below
	writes  []wattempt
	reads   []rread
	leaders []lsample
}

type wattempt struct {
	seq        int64
	start, at  time.Time
	node       string // host:port of the server that acknowledged it
	err        error
	inRecovery bool
}

type rread struct {
	start  time.Time
	maxSeq int64
	node   string
	err    error
}

type lsample struct {
	at   time.Time
	node string // the leader's host:port; "" when there is none
}

func (w *wrec) write(a wattempt) {
	w.mu.Lock()
	w.writes = append(w.writes, a)
	w.mu.Unlock()
}

// monitor samples the leader every 100 ms until ctx ends.
func (w *wrec) monitor(ctx context.Context, leader func() string) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		l := leader()
		w.mu.Lock()
		w.leaders = append(w.leaders, lsample{time.Now(), l})
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// leaderNear reports whether node was the leader in a sample within slack
// of at (the monitor polls, so a change is seen up to 100 ms late).
func (w *wrec) leaderNear(node string, at time.Time, slack time.Duration) bool {
	last := ""
	for _, s := range w.leaders {
		if s.at.After(at.Add(slack)) {
			break
		}
		if !s.at.Before(at.Add(-slack)) && s.node == node {
			return true
		}
		last = s.node
	}
	return last == node
}

// figures are one scenario's results, as the drill report defines them.
type figures struct {
	acked     int
	window    time.Duration // the longest gap between acknowledged writes, from 1 s before the trigger
	failed    int           // attempts after the trigger that were not acknowledged
	lost      int           // acknowledged writes missing on the final primary
	nonLeader int           // acknowledged by a node that was not the leader (within slack)
	stale     int           // reads missing a write acknowledged more than maxLag before them
	maxStale  time.Duration
}

func (f figures) String() string {
	return fmt.Sprintf("window %.2fs, %d failed writes, %d of %d acknowledged writes lost, %d acknowledged by a non-leader, %d stale reads past max_lag (worst %.1fs)",
		f.window.Seconds(), f.failed, f.lost, f.acked, f.nonLeader, f.stale, f.maxStale.Seconds())
}

// analyse computes the figures, given the trigger, the sequence numbers on
// the final primary, and max_lag.
func (w *wrec) analyse(trigger time.Time, present map[int64]bool, maxLag, slack time.Duration) (f figures, lostSeqs []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var acks []wattempt
	for _, a := range w.writes {
		if a.err == nil {
			acks = append(acks, a)
			continue
		}
		if !a.start.Before(trigger) {
			f.failed++
		}
	}
	slices.SortFunc(acks, func(a, b wattempt) int { return a.at.Compare(b.at) })
	f.acked = len(acks)
	var prev time.Time
	for _, a := range acks {
		if !a.at.Before(trigger.Add(-time.Second)) && !prev.IsZero() && a.at.Sub(prev) > f.window {
			f.window = a.at.Sub(prev)
		}
		prev = a.at
		if !present[a.seq] {
			f.lost++
			lostSeqs = append(lostSeqs, a.seq)
		}
		if !w.leaderNear(a.node, a.at, slack) {
			f.nonLeader++
		}
	}
	for _, r := range w.reads {
		if r.err != nil {
			continue
		}
		for _, a := range acks { // the oldest surviving write the read should have seen and did not
			if a.at.After(r.start.Add(-maxLag)) {
				break
			}
			if a.seq > r.maxSeq && present[a.seq] {
				f.stale++
				f.maxStale = max(f.maxStale, r.start.Sub(a.at))
				break
			}
		}
	}
	return f, lostSeqs
}

// clients runs the writer, the reader (when read is set) and the monitor
// until the returned stop is called; stop waits for them.
func (w *wrec) clients(write, read func(ctx context.Context), leader func() string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { write(ctx) })             // exits when stop cancels ctx
	wg.Go(func() { w.monitor(ctx, leader) }) // exits when stop cancels ctx
	if read != nil {
		wg.Go(func() { read(ctx) }) // exits when stop cancels ctx
	}
	return sync.OnceFunc(func() { cancel(); wg.Wait() })
}

// paced calls step every period until ctx ends.
func paced(ctx context.Context, period time.Duration, step func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			step()
		}
	}
}

// pgWriter keeps one session through addr and inserts a new sequence
// number 20 times a second; after any error it closes the session and
// connects again at the next tick.
func (w *wrec) pgWriter(addr string) func(ctx context.Context) {
	return func(ctx context.Context) {
		var c *pgconn.PgConn
		defer func() {
			if c != nil {
				c.Close(context.Background())
			}
		}()
		var seq int64
		paced(ctx, 50*time.Millisecond, func() {
			seq++
			a := wattempt{seq: seq, start: time.Now()}
			if c == nil {
				var err error
				// Longer than rw's hold_timeout: a held connection is served or refused by fulcrum.
				if c, err = pgconn.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=15"); err != nil {
					c = nil
					if ctx.Err() == nil {
						a.at, a.err = time.Now(), err
						w.write(a)
					}
					return
				}
			}
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			res, err := c.Exec(qctx, fmt.Sprintf("INSERT INTO w (seq, port, recovery) VALUES (%d, inet_server_port(), pg_is_in_recovery()) RETURNING port, recovery", seq)).ReadAll()
			a.at = time.Now()
			if err == nil && (len(res) != 1 || len(res[0].Rows) != 1) {
				err = fmt.Errorf("no row returned")
			}
			if err != nil {
				c.Close(context.Background())
				c = nil
				if ctx.Err() == nil {
					a.err = err
					w.write(a)
				}
				return
			}
			a.node = "127.0.0.1:" + string(res[0].Rows[0][0])
			a.inRecovery = string(res[0].Rows[0][1]) == "t"
			w.write(a)
		})
	}
}

// pgReader keeps one session through addr and reads the highest sequence
// number 10 times a second.
func (w *wrec) pgReader(addr string) func(ctx context.Context) {
	return func(ctx context.Context) {
		var c *pgconn.PgConn
		defer func() {
			if c != nil {
				c.Close(context.Background())
			}
		}()
		paced(ctx, 100*time.Millisecond, func() {
			r := rread{start: time.Now()}
			if c == nil {
				var err error
				if c, err = pgconn.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=15"); err != nil {
					c = nil
					return
				}
			}
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			res, err := c.Exec(qctx, "SELECT coalesce(max(seq), 0), inet_server_port() FROM w").ReadAll()
			if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
				c.Close(context.Background())
				c = nil
				return
			}
			r.maxSeq, _ = strconv.ParseInt(string(res[0].Rows[0][0]), 10, 64)
			r.node = "127.0.0.1:" + string(res[0].Rows[0][1])
			w.mu.Lock()
			w.reads = append(w.reads, r)
			w.mu.Unlock()
		})
	}
}

// pgScenarios are the PostgreSQL scenarios; trigger acts on the leader and
// returns once the cluster is on its way back (the rest is waited for by
// the drill).
var pgScenarios = []struct {
	name  string
	short bool // part of the normal test run
}{
	{"switchover", false},
	{"kill-postmaster", false},
	{"kill-patroni", true},
	{"partition", false},
}

// TestOrchestraPatroni runs the PostgreSQL scenarios through fulcrum with
// patroni_port: every acknowledged write must be on the final primary.
// Under FULCRUM_DRILL=1 the kill-patroni scenario also runs with the
// native check alone, to measure what patroni_port changes.
func TestOrchestraPatroni(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Patroni clusters")
	}
	type drillRun struct {
		scenario string
		patroni  bool
	}
	var runs []drillRun
	for _, s := range pgScenarios {
		if s.short || drillFull() {
			runs = append(runs, drillRun{s.name, true})
		}
	}
	if drillFull() {
		runs = append(runs, drillRun{"kill-patroni", false})
	}
	for _, r := range runs {
		name := r.scenario
		if !r.patroni {
			name += "/native-only"
		}
		t.Run(name, func(t *testing.T) {
			f, lost := patroniScenario(t, r.scenario, r.patroni)
			t.Logf("%s (patroni_port %v): %v", r.scenario, r.patroni, f)
			if r.patroni && f.lost > 0 {
				t.Errorf("%d acknowledged writes lost (seqs %v); want 0", f.lost, lost)
			}
			if r.patroni && f.nonLeader > 0 {
				t.Errorf("%d writes acknowledged by a node that did not hold the leader lock; want 0", f.nonLeader)
			}
		})
	}
}

func patroniScenario(t *testing.T, scenario string, patroni bool) (figures, []int64) {
	pc := testkit.StartPatroni(t, 3)
	leader := pc.Leader(t)
	if _, err := testkit.Query(leader.Addr, "CREATE TABLE w (seq bigint PRIMARY KEY, port int NOT NULL, recovery bool NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()); SELECT 1"); err != nil {
		t.Fatal(err)
	}
	const maxLag = 5 * time.Second
	var b strings.Builder
	b.WriteString("[log]\nformat = \"json\"\n[reload]\ndebounce = \"100ms\"\n" +
		"[defaults.health]\ncheck = \"pgsql\"\nuser = \"postgres\"\ninterval = \"500ms\"\ntimeout = \"500ms\"\nrise = 1\nfall = 2\n")
	backends := func() {
		for _, nd := range pc.Nodes {
			extra := ""
			if patroni {
				extra = fmt.Sprintf("health = { patroni_port = %d }\n", nd.RESTPort)
			}
			fmt.Fprintf(&b, "  [[services.%s.backends]]\n  name = %q\n  address = %q\n  %s", "SVC", nd.Name, nd.Addr, extra)
		}
	}
	b.WriteString("[services.rw]\nlisten = [\"127.0.0.1:0\"]\nscheduler = \"first\"\non_down = \"close\"\nsplit_brain = \"refuse\"\n" +
		"hold_timeout = \"10s\"\ndrain_timeout = \"3s\"\nhealth = { role = \"primary\" }\n")
	backends()
	rw := strings.ReplaceAll(b.String(), "SVC", "rw")
	b.Reset()
	b.WriteString(fmt.Sprintf("[services.ro]\nlisten = [\"127.0.0.2:0\"]\nscheduler = \"lc\"\nfallback = \"rw\"\ndrain_timeout = \"3s\"\n"+
		"health = { role = \"replica\", max_lag = %q }\n", maxLag))
	backends()
	ro := strings.ReplaceAll(b.String(), "SVC", "ro")
	fr := startRun(t, t.TempDir(), rw+ro)
	rwAddr, roAddr := fr.addr("127.0.0.1:0"), fr.addr("127.0.0.2:0")

	w := &wrec{}
	stop := w.clients(w.pgWriter(rwAddr), w.pgReader(roAddr), func() string {
		if nd := pc.Node(pc.LeaderName()); nd != nil {
			return nd.Addr
		}
		return ""
	})
	defer stop()
	waitAcked(t, w, leader.Addr, time.Now(), 30*time.Second)
	time.Sleep(time.Second) // steady writes before the event; the drill measures around it

	trigger := time.Now()
	var next *testkit.PatroniNode
	switch scenario {
	case "switchover":
		next = pc.Nodes[0]
		if next == leader {
			next = pc.Nodes[1]
		}
		pc.Switchover(t, leader, next)
	case "kill-postmaster":
		pc.KillPostmaster(t, leader)
	case "kill-patroni":
		pc.KillPatroni(t, leader)
		// The lock expires after its ttl and another node is promoted;
		// then a supervisor restarts the dead Patroni, which demotes its
		// PostgreSQL and rewinds it.
		awaitNewLeader(t, pc, leader.Name, "the kill")
		time.Sleep(3 * time.Second) // the old primary runs on, unfenced, for a while
		pc.StartPatroni(t, leader)
	case "partition":
		// The leader's Patroni loses etcd: it demotes itself after
		// retry_timeout, another node takes the lock after its ttl; then
		// the partition heals and the old leader follows the new one.
		heal := pc.Partition(t, leader)
		awaitNewLeader(t, pc, leader.Name, "the partition")
		time.Sleep(5 * time.Second)
		heal()
	}
	final := pc.WaitHealthy(t, 2*time.Minute)
	if next != nil && final != next {
		t.Logf("the switchover went to %s, not %s", final.Name, next.Name)
	}
	waitAcked(t, w, final.Addr, time.Now(), 30*time.Second)
	time.Sleep(2 * time.Second)
	stop()

	rows, err := testkit.Query(final.Addr, "SELECT seq FROM w")
	if err != nil {
		t.Fatal(err)
	}
	present := map[int64]bool{}
	for _, r := range rows {
		n, _ := strconv.ParseInt(r[0], 10, 64)
		present[n] = true
	}
	if os.Getenv("FULCRUM_DRILL_DEBUG") == "1" {
		w.mu.Lock()
		for _, r := range w.reads {
			t.Logf("read %+.3f max %d on %s", r.start.Sub(trigger).Seconds(), r.maxSeq, r.node)
		}
		w.mu.Unlock()
		for _, m := range fr.logs.All(func(m map[string]any) bool { return m["component"] == "health" }) {
			t.Logf("%v", m)
		}
	}
	return w.analyse(trigger, present, maxLag, 150*time.Millisecond)
}

// PatroniWait bounds the wait for a new leader: the lock's ttl and a loop.
const PatroniWait = testkit.PatroniTTL + 20*time.Second

// waitAcked waits for a write acknowledged by node after from.
func waitAcked(t *testing.T, w *wrec, node string, from time.Time, within time.Duration) {
	t.Helper()
	testkit.WaitFor(t, within, func() error { // the writer's acknowledgements are a list, not events
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range slices.Backward(w.writes) {
			if a.at.Before(from) {
				break
			}
			if a.err == nil && a.node == node {
				return nil
			}
		}
		return fmt.Errorf("no write acknowledged by %s since %v", node, from)
	})
}

// awaitNewLeader waits for Patroni to elect a leader other than old after
// what; the election gives the test no event.
func awaitNewLeader(t *testing.T, pc *testkit.PatroniCluster, old, what string) {
	t.Helper()
	testkit.WaitFor(t, PatroniWait, func() error {
		if l := pc.LeaderName(); l == "" || l == old {
			return fmt.Errorf("Patroni's leader after %s: %q; want a new one (old %s)", what, l, old)
		}
		return nil
	})
}

// redisWriter keeps one connection through addr and, 20 times a second,
// appends a new sequence number to a list and asks the answering server's
// port, in one round trip; after any error it reconnects at the next tick.
func (w *wrec) redisWriter(addr string) func(ctx context.Context) {
	return func(ctx context.Context) {
		var c net.Conn
		var r *bufio.Reader
		defer func() {
			if c != nil {
				c.Close()
			}
		}()
		var seq int64
		paced(ctx, 50*time.Millisecond, func() {
			seq++
			a := wattempt{seq: seq, start: time.Now()}
			fail := func(err error) {
				if c != nil {
					c.Close()
					c = nil
				}
				if ctx.Err() == nil {
					a.at, a.err = time.Now(), err
					w.write(a)
				}
			}
			if c == nil {
				var err error
				if c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr); err != nil {
					c = nil
					fail(err)
					return
				}
				r = bufio.NewReader(c)
			}
			c.SetDeadline(time.Now().Add(8 * time.Second)) // past hold_timeout: a held connection's first answer waits for it
			if _, err := c.Write(append(testkit.RESP("RPUSH", "drill", strconv.FormatInt(seq, 10)), testkit.RESP("CONFIG", "GET", "port")...)); err != nil {
				fail(err)
				return
			}
			v, err := testkit.ReadRESP(r)
			if err != nil {
				fail(err)
				return
			}
			port, perr := testkit.ReadRESP(r)
			if perr != nil {
				fail(perr)
				return
			}
			if re, ok := v.(testkit.RedisError); ok {
				fail(re)
				return
			}
			a.at = time.Now()
			if p, ok := port.([]any); ok && len(p) == 2 {
				a.node = fmt.Sprintf("127.0.0.1:%v", p[1])
			}
			w.write(a)
		})
	}
}

// TestOrchestraSentinel runs the Redis scenarios through fulcrum with
// sentinels and master_name.
func TestOrchestraSentinel(t *testing.T) {
	scenarios := []string{"failover"}
	if drillFull() {
		scenarios = append(scenarios, "kill-master")
	}
	for _, sc := range scenarios {
		t.Run(sc, func(t *testing.T) {
			f, lost := sentinelScenario(t, sc)
			t.Logf("%s: %v", sc, f)
			// The old master is out at the failover's first event
			// (+try-failover, before the promotion: fulcrum subscribes to
			// every Sentinel), so that no write it acknowledges is erased.
			if f.lost > 0 {
				t.Errorf("%d acknowledged writes lost (seqs %v); want 0", f.lost, lost)
			}
			if f.nonLeader > 0 {
				t.Errorf("%d writes acknowledged by a node the Sentinels did not name; want 0", f.nonLeader)
			}
		})
	}
}

func sentinelScenario(t *testing.T, scenario string) (figures, []int64) {
	ss := testkit.StartSentinel(t, 2)
	var b strings.Builder
	b.WriteString("[log]\nformat = \"json\"\n[reload]\ndebounce = \"100ms\"\n" +
		"[services.redis]\nlisten = [\"127.0.0.1:0\"]\nscheduler = \"first\"\non_down = \"close\"\nsplit_brain = \"refuse\"\n" +
		"hold_timeout = \"5s\"\ndrain_timeout = \"3s\"\n")
	fmt.Fprintf(&b, "health = { check = \"redis\", role = \"primary\", interval = \"500ms\", timeout = \"500ms\", rise = 1, fall = 1, master_name = %q, sentinels = [%q, %q, %q] }\n",
		ss.Name, ss.Sentinels[0], ss.Sentinels[1], ss.Sentinels[2])
	for i, r := range ss.Redis {
		fmt.Fprintf(&b, "  [[services.redis.backends]]\n  name = \"r%d\"\n  address = %q\n", i+1, r.Addr)
	}
	fr := startRun(t, t.TempDir(), b.String())
	addr := fr.addr("127.0.0.1:0")
	old := ss.Master()

	w := &wrec{}
	stop := w.clients(w.redisWriter(addr), nil, ss.Master)
	defer stop()
	waitAcked(t, w, old, time.Now(), 30*time.Second)
	time.Sleep(time.Second)

	trigger := time.Now()
	switch scenario {
	case "failover":
		ss.Failover(t)
	case "kill-master":
		ss.ByAddr(old).Kill()
	}
	var next string
	testkit.WaitFor(t, 60*time.Second, func() error { // the election gives the test no event
		if next = ss.Master(); next == "" || next == old {
			return fmt.Errorf("the Sentinels name %q as master; want a new one (old %s)", next, old)
		}
		return nil
	})
	if scenario == "kill-master" {
		time.Sleep(3 * time.Second)
		ss.ByAddr(old).Start(t) // with its own configuration: a master again, until Sentinel converts it
	}
	ss.WaitSettled(t, 2, 90*time.Second)
	waitAcked(t, w, next, time.Now(), 30*time.Second)
	time.Sleep(2 * time.Second)
	stop()

	v, err := testkit.RedisDo(ss.Master(), "LRANGE", "drill", "0", "-1")
	if err != nil {
		t.Fatal(err)
	}
	present := map[int64]bool{}
	list, _ := v.([]any)
	for _, e := range list {
		s, _ := e.(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		present[n] = true
	}
	if os.Getenv("FULCRUM_DRILL_DEBUG") == "1" {
		for _, m := range fr.logs.All(func(m map[string]any) bool { return m["component"] != nil }) {
			t.Logf("%v", m)
		}
		w.mu.Lock()
		for _, a := range w.writes {
			if d := a.at.Sub(trigger); d > -300*time.Millisecond && d < 8*time.Second && (a.err != nil || d < time.Second || a.node != old) {
				t.Logf("seq %d start %+.3f at %+.3f node %s err %v", a.seq, a.start.Sub(trigger).Seconds(), d.Seconds(), a.node, a.err)
			}
		}
		w.mu.Unlock()
	}
	return w.analyse(trigger, present, 0, time.Second)
}
