package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// TestReplicationLagKept: the lag a pgsql check of a replica measures is
// kept on the backend for status and metrics, with max_lag or without:
// 0 while it is caught up, growing while its replay is paused, unknown on
// a primary and once the checks stop.
func TestReplicationLagKept(t *testing.T) {
	pg := testkit.StartPostgres(t)
	rep := pg.Replica(t)
	pg.Exec(t, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
	check := func(addr string) (*backend.Backend, func()) {
		b := backend.New("ro", addr)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // exits when stop cancels ctx
			defer close(done)
			RunChecks(ctx, b, CheckSpec{Probe: Probe{Kind: CheckPgSQL, Addr: addr, Timeout: 2 * time.Second, User: "postgres", Role: backend.RoleReplica},
				Interval: 100 * time.Millisecond, Rise: 1, Fall: 1})
		}()
		return b, func() { cancel(); <-done }
	}
	await := func(what string, b *backend.Backend, ok func(time.Duration, bool) bool) {
		t.Helper()
		testkit.WaitFor(t, 30*time.Second, func() error {
			if lag, known := b.Lag(); !ok(lag, known) {
				return fmt.Errorf("%s: lag %v, known %v", what, lag, known)
			}
			return nil
		})
	}
	awaitReplay(t, rep) // before it, a paused replica's lag is unknown
	r, stop := check(rep.Addr)
	await("a caught-up replica", r, func(l time.Duration, ok bool) bool { return ok && l == 0 })
	rep.Exec(t, "SELECT pg_wal_replay_pause()")
	pg.Exec(t, "INSERT INTO t VALUES (2)")
	await("a paused replica", r, func(l time.Duration, ok bool) bool { return ok && l > 0 })
	rep.Exec(t, "SELECT pg_wal_replay_resume()")
	await("a resumed replica", r, func(l time.Duration, ok bool) bool { return ok && l == 0 })
	stop()
	if _, ok := r.Lag(); ok {
		t.Error("the lag is still known after the checks stopped")
	}
	p, stopP := check(pg.Addr)
	defer stopP()
	testkit.WaitFor(t, 30*time.Second, func() error { // the checks run on their own; no event but the result
		if p.Checks().Count == 0 {
			return errors.New("no check of the primary")
		}
		return nil
	})
	if lag, ok := p.Lag(); ok {
		t.Errorf("a primary has lag %v; want none", lag)
	}
}

// runChecks runs spec on a fresh backend until the test ends.
func runChecks(t *testing.T, spec CheckSpec) (*backend.Backend, <-chan *backend.Backend) {
	t.Helper()
	changes := make(chan *backend.Backend, 16)
	pool := backend.Pool{Changes: changes}
	b := pool.Get("s", spec.Probe.Addr)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); RunChecks(ctx, b, spec) }() // exits when ctx is cancelled
	t.Cleanup(func() { cancel(); <-done })
	return b, changes
}

// waitLag polls b until its checks have measured a lag.
func waitLag(t *testing.T, b *backend.Backend) time.Duration {
	t.Helper()
	var lag time.Duration
	testkit.WaitFor(t, 30*time.Second, func() error { // the checks run on their own; no event but the result
		var known bool
		if lag, known = b.Lag(); !known {
			return fmt.Errorf("backend %s: no lag measured", b.Name)
		}
		return nil
	})
	return lag
}

// awaitReplay waits until the PostgreSQL replica rep has replayed a
// transaction: replay gives no event but its timestamp.
func awaitReplay(t *testing.T, rep *testkit.Postgres) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, func() error {
		if rep.Exec(t, "SELECT pg_last_xact_replay_timestamp() IS NOT NULL")[0][0] != "t" {
			return errors.New("the replica has replayed nothing")
		}
		return nil
	})
}

// TestLagMariaDB: a MariaDB replica within max_lag is up with its lag on
// the Backend; after STOP SLAVE SQL_THREAD (and IO_THREAD) it is down,
// saying which thread, and comes back after START SLAVE.
func TestLagMariaDB(t *testing.T) {
	primary, replica := testkit.StartMariaDBReplica(t)
	pw := secret(t, testkit.MD5Password)
	clock := &WALClock{}
	mk := func(m *testkit.MariaDB) Probe {
		return Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: time.Second, User: "checker", PasswordFile: pw, Role: backend.RoleReplica, MaxLag: 5 * time.Second, WAL: clock}
	}
	// The primary's check records its binary log position (it is the wrong role here).
	prim, _ := runChecks(t, CheckSpec{Probe: mk(primary), Interval: 200 * time.Millisecond, Rise: 1, Fall: 1})
	b, changes := runChecks(t, CheckSpec{Probe: mk(replica), Interval: 200 * time.Millisecond, Rise: 1, Fall: 2})
	primary.Exec(t, "INSERT INTO app.t (v) VALUES ('one')")
	if lag := waitLag(t, b); lag > 5*time.Second || b.Down() {
		t.Errorf("lag %s of a streaming replica, down %v", lag, b.Down())
	}
	if _, known := prim.Lag(); known {
		t.Error("a primary has a lag")
	}

	for _, thread := range []string{"SQL", "IO"} {
		replica.Exec(t, "STOP SLAVE "+thread+"_THREAD")
		awaitState(t, changes, b, true, 30*time.Second)
		_, reason, _ := b.Health()
		t.Logf("STOP SLAVE %s_THREAD: %s", thread, reason)
		if !strings.Contains(reason, "replication "+thread+" thread is not running") {
			t.Errorf("reason %q; want the %s thread named", reason, thread)
		}
		if _, known := b.Lag(); known {
			t.Error("a stopped replica's lag is known")
		}
		replica.Exec(t, "START SLAVE")
		awaitState(t, changes, b, false, 30*time.Second)
	}
}

// TestLagRedis: a Redis replica whose primary is SIGSTOPped keeps
// master_link_status:up (until repl-timeout, 60s) and an offset equal to
// the last it got, but master_last_io_seconds_ago grows: it goes down
// over max_lag, well before the link is declared down, and comes back
// when the primary continues.
func TestLagRedis(t *testing.T) {
	primary := testkit.StartRedis(t, "--repl-ping-replica-period", "1")
	replica := testkit.StartRedis(t, "--replicaof", "127.0.0.1", primary.Addr[strings.LastIndexByte(primary.Addr, ':')+1:])
	clock := &WALClock{}
	mk := func(r *testkit.Redis) Probe {
		return Probe{Kind: CheckRedis, Addr: r.Addr, Timeout: time.Second, Role: backend.RoleReplica, MaxLag: 3 * time.Second, WAL: clock}
	}
	runChecks(t, CheckSpec{Probe: mk(primary), Interval: 200 * time.Millisecond, Rise: 1, Fall: 1})
	b, changes := runChecks(t, CheckSpec{Probe: mk(replica), Interval: 200 * time.Millisecond, Rise: 1, Fall: 2})
	if lag := waitLag(t, b); lag > 3*time.Second || b.Down() {
		t.Errorf("lag %s of a streaming replica, down %v", lag, b.Down())
	}
	primary.Pause(t)
	paused := time.Now()
	awaitState(t, changes, b, true, 30*time.Second)
	took := time.Since(paused)
	primary.Resume(t)
	_, reason, _ := b.Health()
	t.Logf("primary SIGSTOPped: replica down after %s: %s", took.Round(time.Millisecond), reason)
	if !strings.Contains(reason, "over max_lag") {
		t.Errorf("reason %q; want the lag over max_lag", reason)
	}
	awaitState(t, changes, b, false, 30*time.Second)
}

// TestLagMariaDBSilentStream: the replica's stream goes silent (a relay
// between it and its primary freezes) while the primary writes and
// answers its checks. The IO thread still runs and Seconds_Behind_Master
// reads 0, but the replica's executed position stays where the primary
// was when the stream stopped: it goes out over max_lag by the clock, and
// comes back when the stream resumes.
func TestLagMariaDBSilentStream(t *testing.T) {
	var relay *testkit.Relay
	primary, replica := testkit.StartMariaDBReplicaVia(t, func(addr string) string {
		relay = testkit.NewRelay(t, addr)
		return relay.Addr
	})
	pw := secret(t, testkit.MD5Password)
	clock := &WALClock{}
	mk := func(m *testkit.MariaDB) Probe {
		return Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: time.Second, User: "checker", PasswordFile: pw, Role: backend.RoleReplica, MaxLag: 3 * time.Second, WAL: clock}
	}
	runChecks(t, CheckSpec{Probe: mk(primary), Interval: 200 * time.Millisecond, Rise: 1, Fall: 1})
	b, changes := runChecks(t, CheckSpec{Probe: mk(replica), Interval: 200 * time.Millisecond, Rise: 1, Fall: 2})
	// The clock must know a position at or before the one the replica
	// stops at (it leaves a replica behind all it knows to its own view):
	// a mark first, then a write the replica applies.
	testkit.WaitFor(t, 30*time.Second, func() error { // the checks run on their own; no event but the result
		if marks(clock) == 0 {
			return errors.New("the primary's checks recorded no position")
		}
		return nil
	})
	primary.Exec(t, "INSERT INTO app.t (v) VALUES ('before')")
	testkit.WaitFor(t, 30*time.Second, func() error { // replication gives the test no event
		if n := replica.Query(t, "SELECT COUNT(*) FROM app.t"); n != "1" {
			return fmt.Errorf("the replica has %s rows; want the 1 written", n)
		}
		return nil
	})
	if lag := waitLag(t, b); lag > 3*time.Second || b.Down() {
		t.Fatalf("lag %s of a streaming replica, down %v", lag, b.Down())
	}

	relay.Freeze()
	frozen := true
	defer func() {
		if frozen {
			relay.Thaw() // the relay's goroutines must end at cleanup
		}
	}()
	start := time.Now()
	for deadline := start.Add(30 * time.Second); !b.Down(); {
		if time.Now().After(deadline) {
			_, reason, _ := b.Health()
			t.Fatalf("replica still up 30s into a silent stream: %s", reason)
		}
		primary.Exec(t, "INSERT INTO app.t (v) VALUES ('during')") // the primary writes on: its position moves
		select {
		case <-changes:
			b.Seen()
		case <-time.After(100 * time.Millisecond): // pacing the writes, not waiting for an event
		}
	}
	_, reason, _ := b.Health()
	t.Logf("silent stream: down after %s: %s", time.Since(start).Round(time.Millisecond), reason)
	if !strings.Contains(reason, "over max_lag") {
		t.Errorf("reason %q; want the lag over max_lag", reason)
	}
	relay.Thaw()
	frozen = false
	awaitState(t, changes, b, false, 30*time.Second)
}

// marks is how many positions the clock holds.
func marks(c *WALClock) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.marks)
}
