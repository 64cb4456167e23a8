package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

func probe(kind CheckKind, addr string) *Probe {
	return &Probe{Kind: kind, Addr: addr, Timeout: 2 * time.Second}
}

func TestProbeTCP(t *testing.T) {
	up := testkit.NewServer(t, func(*net.TCPConn) {})
	if err := probe("tcp", up.Addr).Run(t.Context()); err != nil {
		t.Errorf("tcp on a listener: %v", err)
	}
	if err := probe("tcp", testkit.DeadAddr(t)).Run(t.Context()); err == nil {
		t.Error("tcp on a dead port succeeded")
	}
}

// TestProbeSendExpect: a backend that accepts but never answers fails the
// check within its timeout; one that answers as expected passes.
func TestProbeSendExpect(t *testing.T) {
	mute := testkit.NewServer(t, func(c *net.TCPConn) {
		var b [1]byte
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		c.Read(b[:]) // accepts, reads nothing useful, never answers
	})
	p := &Probe{Kind: "send-expect", Addr: mute.Addr, Timeout: 300 * time.Millisecond, Send: []byte("HELLO\r\n"), Expect: regexp.MustCompile(`^OK`)}
	start := time.Now()
	if err := p.Run(t.Context()); err == nil {
		t.Error("send-expect on a mute backend succeeded")
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("send-expect took %v; want about its 300ms timeout", el)
	}
	p.Addr = testkit.NewServer(t, testkit.Echo).Addr
	p.Send, p.Expect = []byte("OK ready\n"), regexp.MustCompile(`OK ready`)
	if err := p.Run(t.Context()); err != nil {
		t.Errorf("send-expect on an echo: %v", err)
	}
}

// TestProbeTimeoutSays: a backend that never answers (the kernel accepts,
// nobody reads) fails its check with "timed out after", not with the
// closed socket the deadline left behind.
func TestProbeTimeoutSays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // never accepted: the backlog holds the probe's connection
	for _, kind := range []CheckKind{CheckRedis, CheckSendExpect} {
		p := &Probe{Kind: kind, Addr: ln.Addr().String(), Timeout: 200 * time.Millisecond, Send: []byte("HELLO\r\n"), Expect: regexp.MustCompile(`^OK`)}
		err := p.Run(t.Context())
		if want := string(kind) + " check timed out after 200ms"; err == nil || err.Error() != want {
			t.Errorf("%s on a mute backend: %v; want %q", kind, err, want)
		}
	}
}

func TestProbeHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/primary" { // Patroni's REST API: 200 on the leader only
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})}
	go srv.Serve(ln) // exits when the cleanup closes the server
	t.Cleanup(func() { srv.Close() })
	p := probe("http", ln.Addr().String())
	p.Path = "/primary"
	if err := p.Run(t.Context()); err != nil {
		t.Errorf("GET /primary: %v", err)
	}
	p.Path = "/replica"
	if err := p.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("GET /replica = %v; want a 503 failure", err)
	}
	p.Status = 503
	if err := p.Run(t.Context()); err != nil {
		t.Errorf("GET /replica expecting 503: %v", err)
	}
}

// TestProbeMySQL uses scripted greetings for what a real server rarely
// does; TestMariaDBRoles logs in to a real one.
func TestProbeMySQL(t *testing.T) {
	greet := func(payload []byte) func(*net.TCPConn) {
		return func(c *net.TCPConn) {
			n := len(payload)
			c.Write(append([]byte{byte(n), byte(n >> 8), byte(n >> 16), 0}, payload...))
		}
	}
	tooMany := append([]byte{0xff, 0x10, 0x04}, "Too many connections"...)
	if err := probe("mysql", testkit.NewServer(t, greet(tooMany)).Addr).Run(t.Context()); err == nil || !strings.Contains(err.Error(), "Too many connections") {
		t.Errorf("mysql error greeting = %v; want down", err)
	}
	if err := probe("mysql", testkit.NewServer(t, testkit.Greeter("SSH-2.0-OpenSSH")).Addr).Run(t.Context()); err == nil {
		t.Error("an SSH banner passed the mysql check")
	}
}

func TestProbePostgres(t *testing.T) {
	pg := testkit.StartPostgres(t)
	if err := probe("pgsql", pg.Addr).Run(t.Context()); err != nil {
		t.Fatalf("pgsql on a running cluster: %v", err)
	}
	p := probe("pgsql", pg.Addr)
	p.User = "nobody-in-pg-hba"
	if err := p.Run(t.Context()); err != nil {
		t.Errorf("pgsql with an unknown user (the server is still up): %v", err)
	}
	if err := probe("pgsql", testkit.NewServer(t, testkit.Greeter("+PONG")).Addr).Run(t.Context()); err == nil {
		t.Error("a non-PostgreSQL server passed the pgsql check")
	}

	// A standby that does not accept connections (hot_standby off) answers
	// with 57P03: up as a process, down as a database.
	pg.Stop(t, "fast")
	os.WriteFile(filepath.Join(pg.Dir, "standby.signal"), nil, 0o600)
	f, _ := os.OpenFile(filepath.Join(pg.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("hot_standby = off\n")
	f.Close()
	pg.Ctl(t, "start", "-W", "-l", filepath.Join(filepath.Dir(pg.Dir), "log"))
	testkit.WaitFor(t, 30*time.Second, func() error { // the standby's start gives no event but its answer
		if err := probe("pgsql", pg.Addr).Run(t.Context()); err == nil || !strings.Contains(err.Error(), "57P03") {
			return fmt.Errorf("pgsql on a standby that refuses connections = %v; want down with 57P03", err)
		}
		return nil
	})
	pg.Stop(t, "immediate")
	if err := probe("pgsql", pg.Addr).Run(t.Context()); err == nil {
		t.Error("pgsql on a stopped cluster succeeded")
	}
}

func TestProbeRedis(t *testing.T) {
	r := testkit.StartRedis(t)
	if err := probe("redis", r.Addr).Run(t.Context()); err != nil {
		t.Errorf("redis PING: %v", err)
	}
	auth := testkit.StartRedis(t, "--requirepass", "secret")
	if err := probe("redis", auth.Addr).Run(t.Context()); err != nil {
		t.Errorf("redis with a password (-NOAUTH is still a live Redis): %v", err)
	}
	r.Kill()
	if err := probe("redis", r.Addr).Run(t.Context()); err == nil {
		t.Error("redis PING on a killed server succeeded")
	}
	if err := probe("redis", testkit.NewServer(t, testkit.Greeter("-LOADING Redis is loading the dataset in memory")).Addr).Run(t.Context()); err == nil {
		t.Error("-LOADING passed the redis check")
	}
}

// TestRunChecksStops: RunChecks returns promptly when its context ends,
// even in the middle of a probe.
func TestRunChecksStops(t *testing.T) {
	testkit.CheckLeaks(t)
	mute := testkit.NewServer(t, func(c *net.TCPConn) {
		var b [1]byte
		c.Read(b[:])
	})
	var p backend.Pool
	b := p.Get("s", "a")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { // exits when ctx ends
		RunChecks(ctx, b, CheckSpec{Probe: Probe{Kind: "send-expect", Addr: mute.Addr, Timeout: time.Hour, Expect: regexp.MustCompile("x")},
			Interval: time.Millisecond, Rise: 1, Fall: 1})
		close(done)
	}()
	testkit.WaitFor(t, 5*time.Second, func() error { // the server has no event for "a probe is in progress"
		if mute.Open() == 0 {
			return errors.New("no probe reached the server")
		}
		return nil
	})
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunChecks did not stop with its context")
	}
	if b.Down() {
		t.Error("a cancelled probe marked the backend down")
	}
}
