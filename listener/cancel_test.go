package listener

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	proxyproto "github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"

	"fulcrum/internal/testkit"
)

// TestCancelPostgres: a primary and two streaming replicas behind one
// service; 20 runs of pg_sleep(30), each cancelled by its client, are
// cancelled within a second, on a plain address (lc, with max_conns = 1,
// which the cancel must not wait for) and on one routed by name (rr, the
// query over TLS, the cancel in plain, as libpq's PQcancel sends it). A
// cancel from an address that holds no session goes to every backend.
func TestCancelPostgres(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts a PostgreSQL primary and two replicas")
	}
	testkit.CheckLeaks(t)
	ca := testkit.NewCA(t)
	pg := testkit.StartPostgres(t)
	pg.EnableTLS(t, "lc", ca.Issue(t, "db.example.com"))
	dbs := []*testkit.Postgres{pg, pg.Replica(t), pg.Replica(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	watch := make([]*pgconn.PgConn, len(dbs)) // direct: to see where a query runs
	for i, db := range dbs {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", db.Port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		watch[i] = c
	}

	t.Run("plain", func(t *testing.T) {
		p := newProxy(t, "lc", []testBackend{{"0", dbs[0].Addr, 1}, {"1", dbs[1].Addr, 1}, {"2", dbs[2].Addr, 1}}, func(tu tuned) {
			tu.Postgres, tu.MaxConns, tu.QueueTimeout = true, 1, 10*time.Second
		})
		connect := func() (*pgconn.PgConn, error) {
			return pgconn.Connect(ctx, "host=127.0.0.1 port="+port(p.addr)+" user=postgres dbname=postgres sslmode=disable connect_timeout=20")
		}
		cancels(ctx, t, connect, watch, p.logs, func(c *pgconn.PgConn) error { return c.CancelRequest(ctx) })
		for i, tg := range p.svc.Targets {
			if st := tg.B.Stats(); st.ConnectFails != 0 {
				t.Errorf("backend %d: %d connect failures", i, st.ConnectFails)
			}
		}
		var total uint64
		for _, tg := range p.svc.Targets {
			total += tg.B.Stats().Total
		}
		if total != 21 { // the 20 runs and the one from elsewhere; no cancel
			t.Errorf("backends took %d sessions; want 21", total)
		}
		p.settle(t, 0)
	})

	t.Run("sni", func(t *testing.T) {
		p := startRouted(t, zerolog.DebugLevel, []routeSpec{{name: "lc", sni: []string{"db.example.com"}, backends: []string{dbs[0].Addr, dbs[1].Addr, dbs[2].Addr}}})
		connect := func() (*pgconn.PgConn, error) {
			cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=" + port(p.addr) + " user=postgres dbname=postgres sslmode=require connect_timeout=20")
			if err != nil {
				return nil, err
			}
			cfg.TLSConfig = &tls.Config{ServerName: "db.example.com", RootCAs: ca.Pool}
			cfg.Fallbacks = nil
			return pgconn.ConnectConfig(ctx, cfg)
		}
		cancels(ctx, t, connect, watch, p.logs, func(c *pgconn.PgConn) error { return plainCancel(p.addr, "127.0.0.1", c) })
	})
}

// cancels runs pg_sleep(30) 20 times through a connection from connect,
// cancels each with cancel once it runs (on one of the servers watch is
// connected to), and requires each to end cancelled within a second, and
// the cancel's access line to name the backend alone. A 21st run is
// cancelled from 127.0.0.2, which holds no session: it must go to every
// backend and still cancel.
func cancels(ctx context.Context, t *testing.T, connect func() (*pgconn.PgConn, error), watch []*pgconn.PgConn, logs *testkit.LogSink, cancel func(*pgconn.PgConn) error) {
	t.Helper()
	var worst time.Duration
	for run := range 21 {
		c, err := connect()
		if err != nil {
			t.Fatalf("run %d: connect: %v", run, err)
		}
		done := make(chan error, 1)
		go func() { // ends when the query does: cancelled, or after 30 s
			_, err := c.Exec(ctx, "SELECT pg_sleep(30)").ReadAll()
			done <- err
		}()
		on := runningOn(ctx, t, watch, c.PID())
		t0 := time.Now()
		if run == 20 {
			err = plainCancel(c.Conn().RemoteAddr().String(), "127.0.0.2", c)
		} else {
			err = cancel(c)
		}
		if err != nil {
			t.Fatalf("run %d: cancel: %v", run, err)
		}
		var qerr error
		select {
		case qerr = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: the query on backend %d still runs 10 s after its cancel", run, on)
		}
		took := time.Since(t0)
		worst = max(worst, took)
		var pe *pgconn.PgError
		if !errors.As(qerr, &pe) || pe.Code != "57014" {
			t.Errorf("run %d: query ended with %v; want query_canceled (57014)", run, qerr)
		}
		if took > time.Second {
			t.Errorf("run %d: cancelled after %v; want within 1 s", run, took)
		}
		n := 0 // the cancel lines before this run's: Wait reads from the first line
		line := logs.Wait(t, 10*time.Second, fmt.Sprintf("run %d's cancel", run), func(m map[string]any) bool {
			if isAccess(m) && m["end"] == endCancel {
				n++
			}
			return n > run
		})
		// The backend running the query; a previous run's session there
		// or elsewhere may not have ended yet, and would have it too.
		got, _ := line["backends"].([]any)
		want := fmt.Sprint(on)
		if run == 20 && len(got) != 3 || !slices.Contains(got, any(want)) || line["holding"] != (run < 20) {
			t.Errorf("run %d: cancel went to %v (holding %v); want backend %s, or all three from another address", run, got, line["holding"], want)
		}
		c.Close(ctx)
	}
	t.Logf("21 cancels: the slowest ended its query %v after the cancel was sent", worst)
}

// runningOn waits until the backend with process pid runs a query, on one
// of the servers of watch, and returns that server's index.
func runningOn(ctx context.Context, t *testing.T, watch []*pgconn.PgConn, pid uint32) int {
	t.Helper()
	q := fmt.Sprintf("SELECT 1 FROM pg_stat_activity WHERE pid = %d AND state = 'active' AND query LIKE '%%pg_sleep%%'", pid)
	on := -1
	testkit.WaitFor(t, 20*time.Second, func() error { // the server tells no event: poll
		for i, w := range watch {
			res, err := w.Exec(ctx, q).ReadAll()
			if err != nil {
				return fmt.Errorf("pg_stat_activity: %w", err)
			}
			if len(res) > 0 && len(res[0].Rows) > 0 {
				on = i
				return nil
			}
		}
		return fmt.Errorf("process %d runs no query on any server", pid)
	})
	return on
}

// plainCancel sends c's CancelRequest to addr from local address from, in
// plain, as libpq's PQcancel does (and pgconn's CancelRequest for a
// connection without TLS), and waits for the close that acknowledges it.
func plainCancel(addr, from string, c *pgconn.PgConn) error {
	pkt, err := (&pgproto3.CancelRequest{ProcessID: c.PID(), SecretKey: c.SecretKey()}).Encode(nil)
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(pkt); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, nc)
	return err
}

// port is the port of host:port address a.
func port(a string) string { return a[strings.LastIndexByte(a, ':')+1:] }

// TestCancelFanOut: a cancel from an address that holds no session goes
// to every backend of the service, each on its own connection, the PROXY
// header first where the backend takes one, and arrives whole (a protocol
// 3.2 key of 256 bytes); the client's connection closes once the backends
// have closed theirs. It takes no slot, counts nothing on the service or
// the backends, and its access line says where it went.
func TestCancelFanOut(t *testing.T) {
	testkit.CheckLeaks(t)
	type got struct {
		hdr *proxyproto.Header
		pkt []byte
	}
	var backends []testBackend
	recv := make([]chan got, 2)
	for i := range recv {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		recv[i] = make(chan got, 1)
		done := make(chan struct{})
		go func() { // exits when the one connection it serves ends
			defer close(done)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			var g got
			if i == 1 {
				g.hdr, _ = proxyproto.Read(br)
			}
			var n [4]byte
			if _, err := io.ReadFull(br, n[:]); err == nil {
				g.pkt = make([]byte, binary.BigEndian.Uint32(n[:]))
				copy(g.pkt, n[:])
				io.ReadFull(br, g.pkt[4:])
			}
			recv[i] <- g
		}()
		t.Cleanup(func() { ln.Close(); <-done })
		backends = append(backends, testBackend{fmt.Sprint(i), ln.Addr().String(), 1})
	}
	p := newProxy(t, "rr", backends, func(tu tuned) {
		tu.Postgres, tu.MaxConns = true, 1
		tu.Targets[1].ProxyProtocol = 2
	})
	key := make([]byte, 256)
	for i := range key {
		key[i] = byte(i)
	}
	pkt, err := (&pgproto3.CancelRequest{ProcessID: 77, SecretKey: key}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// In two parts: the first is not enough to tell, and must be waited on.
	if _, err := c.Write(pkt[:6]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the first part arrive alone; either way the test holds
	if _, err := c.Write(pkt[6:]); err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, c); n != 0 || err != nil {
		t.Fatalf("the client read %d bytes, %v; want a close and nothing", n, err)
	}
	for i, ch := range recv {
		var g got
		select {
		case g = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("backend %d got no connection within 10 s", i)
		}
		if !bytes.Equal(g.pkt, pkt) {
			t.Errorf("backend %d got %x; want %x", i, g.pkt, pkt)
		}
		if i == 1 && (g.hdr == nil || g.hdr.SourceAddr.String() != c.LocalAddr().String()) {
			t.Errorf("backend 1's PROXY header %v; want the client %v", g.hdr, c.LocalAddr())
		}
	}
	line := p.logs.Wait(t, 10*time.Second, "the cancel's access line", func(m map[string]any) bool { return isAccess(m) })
	if line["end"] != endCancel || fmt.Sprint(line["backends"]) != "[0 1]" || line["holding"] != false {
		t.Errorf("access line %v; want end cancel to backends [0 1], holding none", line)
	}
	p.settle(t, 0)
	for i, tg := range p.svc.Targets {
		if st := tg.B.Stats(); st.Total != 0 || st.Active != 0 || st.ConnectFails != 0 {
			t.Errorf("backend %d: %+v; a cancel is no session", i, st)
		}
	}
	if st := p.adm().stats(); st.Active != 0 || st.Waiting != 0 || st.Retries != 0 || st.Queued != 0 || st.Refused != 0 || st.Splits != 0 {
		t.Errorf("service: %+v; a cancel is no session", st)
	}
}

// TestCancelServerFirst: a service that is not PostgreSQL never waits for
// the client's first bytes, so a server-first protocol's greeting comes at
// once even with a long preread_timeout; a PostgreSQL one waits for them
// up to preread_timeout, then serves the client as usual.
func TestCancelServerFirst(t *testing.T) {
	testkit.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // exits when ln is closed
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("greeting"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	for _, tc := range []struct {
		postgres bool
		preread  time.Duration
	}{{false, time.Minute}, {true, 300 * time.Millisecond}} {
		p := newProxy(t, "rr", []testBackend{{"0", ln.Addr().String(), 1}}, func(tu tuned) {
			tu.Postgres, tu.PrereadTimeout = tc.postgres, tc.preread
		})
		t0 := time.Now()
		c := p.dial(t)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c)
		took := time.Since(t0)
		c.Close()
		if string(b) != "greeting" || err != nil {
			t.Fatalf("postgres %v: read %q, %v; want the greeting", tc.postgres, b, err)
		}
		if tc.postgres && took < tc.preread {
			t.Errorf("postgres: the greeting came after %v, before the wait of %v", took, tc.preread)
		}
		t.Logf("postgres %v, preread_timeout %v: the greeting came after %v", tc.postgres, tc.preread, took)
		p.settle(t, 0)
	}
}
