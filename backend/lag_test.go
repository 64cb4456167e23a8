package backend

import (
	"context"
	"testing"
	"time"

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
	check := func(addr string) (*Backend, func()) {
		b := New("ro", addr)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // exits when stop cancels ctx
			defer close(done)
			b.RunChecks(ctx, CheckSpec{Probe: Probe{Kind: CheckPgSQL, Addr: addr, Timeout: 2 * time.Second, User: "postgres", Role: RoleReplica},
				Interval: 100 * time.Millisecond, Rise: 1, Fall: 1})
		}()
		return b, func() { cancel(); <-done }
	}
	await := func(what string, b *Backend, ok func(time.Duration, bool) bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if lag, known := b.Lag(); ok(lag, known) {
				return
			}
			if time.Now().After(deadline) {
				lag, known := b.Lag()
				t.Fatalf("%s: lag %v, known %v after 30s", what, lag, known)
			}
		}
	}
	for deadline := time.Now().Add(30 * time.Second); rep.Exec(t, "SELECT pg_last_xact_replay_timestamp() IS NOT NULL")[0][0] != "t"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) { // replay gives no event but its timestamp; before it, a paused replica's lag is unknown
			t.Fatal("the replica replayed nothing in 30s")
		}
	}
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
	for deadline := time.Now().Add(30 * time.Second); p.Checks().Count == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no check of the primary in 30s")
		}
	}
	if lag, ok := p.Lag(); ok {
		t.Errorf("a primary has lag %v; want none", lag)
	}
}
