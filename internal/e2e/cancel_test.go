package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fulcrum/internal/testkit"
)

// TestDaemonCancelPostgres: psql on Ctrl-C (SIGINT), through the daemon,
// cancels its pg_sleep(30) on whichever of a primary and two replicas lc
// gave it (idle sessions from another address spread them), within a
// second; the daemon takes the service for PostgreSQL
// from its pgsql checks. The access line names the one backend.
func TestDaemonCancelPostgres(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts a PostgreSQL primary and two replicas")
	}
	pg := testkit.StartPostgres(t)
	dbs := []*testkit.Postgres{pg, pg.Replica(t), pg.Replica(t)}
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
access = true
[services.lc]
listen = ["127.0.0.1:0"]
scheduler = "lc"
health = { check = "pgsql", user = "postgres", interval = "500ms", timeout = "400ms", rise = 1 }
backends = [{ name = "pg0", address = %q }, { name = "pg1", address = %q }, { name = "pg2", address = %q }]
`, dbs[0].Addr, dbs[1].Addr, dbs[2].Addr))
	addr := d.listenAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	watch := make([]*pgconn.PgConn, len(dbs)) // direct: to see where the query runs
	for i, db := range dbs {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", db.Port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		watch[i] = c
	}
	for run := range 5 {
		// An idle session from another client address first, so that lc
		// spreads the queries; the cancels from 127.0.0.1 must pass it by.
		cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=" + port + " user=postgres dbname=postgres sslmode=disable connect_timeout=20")
		if err != nil {
			t.Fatal(err)
		}
		dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		cfg.DialFunc = dialer.DialContext
		idle, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close(context.Background())
		psql := exec.CommandContext(ctx, pg.Bin("psql"), "-X", "-d",
			"host=127.0.0.1 port="+port+" user=postgres dbname=postgres sslmode=disable connect_timeout=20 application_name=cancel"+fmt.Sprint(run),
			"-c", "select pg_sleep(30)")
		var out strings.Builder
		psql.Stdout, psql.Stderr = &out, &out
		if err := psql.Start(); err != nil {
			t.Fatal(err)
		}
		on := runningOn(ctx, t, watch, fmt.Sprint("cancel", run))
		t0 := time.Now()
		psql.Process.Signal(syscall.SIGINT)
		exited := make(chan error, 1)
		go func() { exited <- psql.Wait() }() // psql ends with its query, at the latest after 30 s
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			psql.Process.Kill()
			<-exited
			t.Fatalf("run %d: psql still runs 10 s after SIGINT", run)
		}
		took := time.Since(t0)
		if !strings.Contains(out.String(), "canceling statement due to user request") || took > time.Second {
			t.Errorf("run %d: psql ended after %v with %q; want the query cancelled within 1 s", run, took, out.String())
		}
		line := d.awaitMatch(t, "the cancel's access line", func(m map[string]any) bool {
			return m["message"] == "connection" && m["end"] == "cancel"
		})
		if got := fmt.Sprint(line["backends"]); got != fmt.Sprintf("[pg%d]", on) {
			t.Errorf("run %d: the cancel went to %s; the query ran on pg%d", run, got, on)
		}
		t.Logf("run %d: cancelled on pg%d %v after SIGINT", run, on, took)
	}
}

// runningOn waits until the session called app runs a query on one of the
// servers of watch, and returns that server's index.
func runningOn(ctx context.Context, t *testing.T, watch []*pgconn.PgConn, app string) int {
	t.Helper()
	q := fmt.Sprintf("SELECT 1 FROM pg_stat_activity WHERE application_name = '%s' AND state = 'active'", app)
	on := -1
	testkit.WaitFor(t, 20*time.Second, func() error { // the server tells no event: poll
		for i, w := range watch {
			res, err := w.Exec(ctx, q).ReadAll()
			if err != nil {
				t.Fatalf("pg_stat_activity: %v", err)
			}
			if len(res) > 0 && len(res[0].Rows) > 0 {
				on = i
				return nil
			}
		}
		return fmt.Errorf("%s runs no query on any of %d servers", app, len(watch))
	})
	return on
}
