package listener

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"fulcrum/internal/testkit"
)

// watchedPostgres starts a PostgreSQL primary and returns it, a context
// for the test (two minutes) and a direct session to it, which the test's
// cleanup closes.
func watchedPostgres(t *testing.T) (*testkit.Postgres, context.Context, *pgconn.PgConn) {
	t.Helper()
	pg := testkit.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	watch, err := pgconn.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", pg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watch.Close(context.Background()) })
	return pg, ctx, watch
}

// sleeping starts pg_sleep(30) on a session through proxy address addr
// from 127.0.0.1 and returns the session and the query's outcome, once
// the query runs on pg (watched over watch, a direct session).
func sleeping(ctx context.Context, t *testing.T, addr string, watch *pgconn.PgConn) (*pgconn.PgConn, <-chan error) {
	t.Helper()
	c, err := pgconn.Connect(ctx, "host=127.0.0.1 port="+port(addr)+" user=postgres dbname=postgres sslmode=disable connect_timeout=20")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	done := make(chan error, 1)
	go func() { // ends when the query does: cancelled, or after 30 s
		_, err := c.Exec(ctx, "SELECT pg_sleep(30)").ReadAll()
		done <- err
	}()
	runningOn(ctx, t, []*pgconn.PgConn{watch}, c.PID())
	return c, done
}

// cancelledWithin requires the query whose outcome done gives to end
// cancelled within d.
func cancelledWithin(t *testing.T, done <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57014" {
			t.Errorf("query ended with %v; want query_canceled (57014)", err)
		}
	case <-time.After(d):
		t.Fatalf("the query still runs %v after its cancel", d)
	}
}

// TestCancelScreened: a cancel request passes admission's screen first:
// over the service's accept_rate it is refused and counted as any
// connection is, and never reaches PostgreSQL (whose query runs on); with
// a token in the bucket it cancels. On the old code the first cancel
// cancelled the query.
func TestCancelScreened(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts PostgreSQL")
	}
	testkit.CheckLeaks(t)
	pg, ctx, watch := watchedPostgres(t)
	p := newProxy(t, "rr", []testBackend{{"0", pg.Addr, 1}}, func(tu tuned) { tu.Postgres = true })
	p.adm().setRate(0.001, 1) // one token: the session's
	c, done := sleeping(ctx, t, p.addr, watch)
	if err := c.CancelRequest(ctx); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if n := p.adm().stats().Rejected[RejectRate.String()]; n != 1 {
		t.Errorf("rejected over accept_rate: %d; want the cancel", n)
	}
	select {
	case err := <-done:
		t.Fatalf("the query ended (%v) on a cancel over accept_rate", err)
	default:
	}
	if rows, err := watch.Exec(ctx, fmt.Sprintf("SELECT state FROM pg_stat_activity WHERE pid = %d", c.PID())).ReadAll(); err != nil ||
		len(rows[0].Rows) != 1 || string(rows[0].Rows[0][0]) != "active" {
		t.Errorf("the query's backend after a refused cancel: %v %v; want it active", rows, err)
	}
	p.adm().setRate(1000, 10)
	if err := c.CancelRequest(ctx); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	cancelledWithin(t, done, 5*time.Second)
	p.settle(t, 1)
}

// TestCancelCap: at most maxCancels cancel requests are forwarded at once.
// PostgreSQL is stopped (SIGSTOP), so the kernel takes each forwarded
// cancel's connection and nobody closes it: maxCancels cancels from an
// address that holds no session (each fans out) stay in flight, and the
// next is refused at once, with its access line, and never dialled for.
// Once PostgreSQL runs again each is answered, and nothing is left.
func TestCancelCap(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts PostgreSQL")
	}
	testkit.CheckLeaks(t)
	pg := testkit.StartPostgres(t)
	pidText, err := os.ReadFile(pg.Dir + "/postmaster.pid")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(pidText), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, "rr", []testBackend{{"0", pg.Addr, 1}}, func(tu tuned) { tu.Postgres = true })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		if stopped {
			syscall.Kill(pid, syscall.SIGCONT)
			stopped = false
		}
	}
	defer resume()
	pkt, err := (&pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	send := func() net.Conn {
		c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(pkt); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var inFlight []net.Conn
	for range maxCancels {
		inFlight = append(inFlight, send())
	}
	testkit.WaitFor(t, 20*time.Second, func() error {
		if n := p.srv.cancels.Load(); n != maxCancels {
			return fmt.Errorf("%d cancels in flight; want %d", n, maxCancels)
		}
		return nil
	})
	extra := send()
	extra.SetDeadline(time.Now().Add(cancelTimeout / 2)) // well before an in-flight one's would end
	if n, err := io.Copy(io.Discard, extra); n != 0 || err != nil {
		t.Errorf("the cancel over the cap read %d bytes, %v; want a close at once", n, err)
	}
	extra.Close()
	line := p.logs.Wait(t, 10*time.Second, "the refused cancel's access line", func(m map[string]any) bool {
		return isAccess(m) && m["end"] == endCancel && strings.Contains(fmt.Sprint(m["error"]), "being forwarded already")
	})
	if fmt.Sprint(line["backends"]) != "[]" {
		t.Errorf("the refused cancel went to %v; want none", line["backends"])
	}
	resume()
	for i, c := range inFlight {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("cancel %d: %v; want its close once PostgreSQL answered", i, err)
		}
		c.Close()
	}
	testkit.WaitFor(t, 10*time.Second, func() error {
		if n := p.srv.cancels.Load(); n != 0 {
			return fmt.Errorf("%d cancels still in flight", n)
		}
		return nil
	})
	p.settle(t, 0)
}

// TestCancelDialPath: a cancel is dialled as a session is (Server.dial),
// so with source = "client" it comes from the client's own address:
// PostgreSQL logs the cancel's connection from 127.0.0.3, a client that
// holds no session (so the cancel fans out to the one backend), and the
// query is cancelled. The old net.Dialer sent it from 127.0.0.1.
func TestCancelDialPath(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts PostgreSQL")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("IP_TRANSPARENT needs root; CI must run this test")
		}
		t.Skip("IP_TRANSPARENT needs root (CAP_NET_ADMIN)")
	}
	testkit.CheckLeaks(t)
	pg, ctx, watch := watchedPostgres(t)
	pg.Exec(t, "ALTER SYSTEM SET log_connections = on")
	pg.Exec(t, "SELECT pg_reload_conf()")
	p := newProxy(t, "rr", []testBackend{{"0", pg.Addr, 1}}, func(tu tuned) { tu.Postgres, tu.SourceClient = true, true })
	c, done := sleeping(ctx, t, p.addr, watch)
	_, off := pg.LogSince(t, 0)
	if err := plainCancel(p.addr, "127.0.0.3", c); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	cancelledWithin(t, done, 5*time.Second)
	testkit.WaitFor(t, 10*time.Second, func() error {
		if log, _ := pg.LogSince(t, off); !strings.Contains(log, "connection received: host=127.0.0.3") {
			return fmt.Errorf("PostgreSQL logged no connection from 127.0.0.3 for the cancel:\n%s", log)
		}
		return nil
	})
	p.settle(t, 1)
}
