package backend

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
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = probe("pgsql", pg.Addr).Run(t.Context()); err != nil && strings.Contains(err.Error(), "57P03") {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "57P03") {
		t.Errorf("pgsql on a standby that refuses connections = %v; want down with 57P03", err)
	}
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

// TestRunChecksRiseFall: fall failures in a row mark the backend down, rise
// successes bring it back; each transition is reported once.
func TestRunChecksRiseFall(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	ok := true
	check := func() error {
		if ok {
			return nil
		}
		return fmt.Errorf("refused")
	}
	now := time.Now()
	for range 2 {
		ok = false
		b.checked(check(), 2, 3, now)
	}
	if b.Down() {
		t.Fatal("down after 2 failures; fall is 3")
	}
	b.checked(check(), 2, 3, now)
	if !b.Down() {
		t.Fatal("not down after 3 failures")
	}
	if got := <-changes; got != b {
		t.Fatal("no report of the transition")
	}
	b.Seen()
	ok = true
	b.checked(check(), 2, 3, now)
	if !b.Down() {
		t.Fatal("up after 1 success; rise is 2")
	}
	b.checked(check(), 2, 3, now.Add(time.Second))
	if b.Down() {
		t.Fatal("still down after 2 successes")
	}
	if up, reason, since := b.Health(); !up || !strings.Contains(reason, "passed 2 times") || !since.Equal(now.Add(time.Second)) {
		t.Errorf("Health = %v, %q, %v", up, reason, since)
	}
	select {
	case <-changes:
	default:
		t.Error("no report of the way back up")
	}
}

// TestPassiveThenChecks: a passive mark resets the check count; rise
// passing checks then clear it, without waiting for fail_timeout.
func TestPassiveThenChecks(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	now := time.Now()
	b.checked(nil, 2, 3, now)
	b.checked(nil, 2, 3, now)
	b.PassiveFail(1, time.Hour, now)
	if !b.Down() {
		t.Fatal("not down after max_fails")
	}
	b.checked(nil, 2, 3, now)
	if !b.Down() {
		t.Fatal("one passing check cleared the passive mark; rise is 2")
	}
	b.checked(nil, 2, 3, now)
	if b.Down() {
		t.Fatal("rise passing checks did not clear the passive mark")
	}
	if b.ExpirePassive(now) != (time.Time{}) {
		t.Error("a passive expiry is still pending")
	}
}

func TestPassive(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	now := time.Now()
	if b.PassiveFail(3, 10*time.Second, now) || b.PassiveFail(3, 10*time.Second, now) {
		t.Fatal("down before max_fails")
	}
	b.PassiveOK() // a success starts the count again
	b.PassiveFail(3, 10*time.Second, now)
	b.PassiveFail(3, 10*time.Second, now)
	if b.Down() {
		t.Fatal("down although a success reset the count")
	}
	if !b.PassiveFail(3, 10*time.Second, now.Add(time.Second)) || !b.Down() {
		t.Fatal("not down after 3 failures within fail_timeout")
	}
	if next := b.ExpirePassive(now.Add(5 * time.Second)); next.IsZero() || !b.Down() {
		t.Fatal("passive mark lifted before fail_timeout")
	}
	if next := b.ExpirePassive(now.Add(12 * time.Second)); !next.IsZero() || b.Down() {
		t.Fatal("passive mark not lifted after fail_timeout")
	}
	// Failures spread wider than the window never add up.
	for i := range 5 {
		b.PassiveFail(3, time.Second, now.Add(time.Duration(i)*2*time.Second))
	}
	if b.Down() {
		t.Error("failures 2s apart took it down with a 1s window")
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
	var p Pool
	b := p.Get("s", "a")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { // exits when ctx ends
		b.RunChecks(ctx, CheckSpec{Probe: Probe{Kind: "send-expect", Addr: mute.Addr, Timeout: time.Hour, Expect: regexp.MustCompile("x")},
			Interval: time.Millisecond, Rise: 1, Fall: 1})
		close(done)
	}()
	for deadline := time.Now().Add(5 * time.Second); mute.Open() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the server has no event for "a probe is in progress"
			t.Fatal("no probe reached the server")
		}
	}
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

// TestWrongRole: the first answer in the wrong role makes the backend
// StateWrongRole at once (not after fall), not down, and never eligible;
// fall failures make it down; rise answers in the right role bring it
// back. Each change of state is reported.
func TestWrongRole(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	now := time.Now()
	wrong := &WrongRoleError{Observed: RoleReplica, Want: RolePrimary}
	b.observed(Answer{Role: RoleReplica}, true)
	b.checked(wrong, 2, 3, now) // one answer decides: fall is 3
	if st, role := b.State(); st != StateWrongRole || role != RoleReplica || !b.Down() {
		t.Fatalf("State = %v, %q, Down %v; want wrong role, replica, true", st, role, b.Down())
	}
	if up, reason, _ := b.Health(); up || !strings.Contains(reason, "answers as replica, want primary") {
		t.Errorf("Health = %v, %q", up, reason)
	}
	report := func(what string) {
		t.Helper()
		select {
		case <-changes:
			b.Seen()
		default:
			t.Errorf("no report of %s", what)
		}
	}
	report("up → wrong role")
	for range 2 {
		b.checked(fmt.Errorf("connection refused"), 2, 3, now)
	}
	if st, _ := b.State(); st != StateDown {
		t.Fatalf("State after a failure = %v; want down", st)
	}
	report("wrong role → down")
	b.checked(wrong, 2, 3, now)
	if st, _ := b.State(); st != StateWrongRole {
		t.Fatalf("State after a wrong-role answer = %v; want wrong role", st)
	}
	report("down → wrong role")
	b.observed(Answer{Role: RolePrimary}, true)
	b.checked(nil, 2, 3, now)
	b.checked(nil, 2, 3, now)
	if st, role := b.State(); st != StateUp || role != RolePrimary || b.Down() {
		t.Fatalf("State = %v, %q; want up, primary", st, role)
	}
	report("wrong role → up")
	if StateWrongRole.String() != "wrong role" {
		t.Errorf("StateWrongRole = %q", StateWrongRole)
	}
}

// TestAwaitRole: a backend whose role was never checked is out of rotation
// until its first check, which decides at once; once a role was seen,
// AwaitRole does nothing.
func TestAwaitRole(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	b.AwaitRole(RolePrimary)
	if !b.Down() {
		t.Fatal("an unchecked backend is eligible")
	}
	b.observed(Answer{Role: RolePrimary}, true)
	b.checked(nil, 3, 3, time.Now())
	if b.Down() {
		t.Fatal("the first passing role check did not bring it up at once")
	}
	b.AwaitRole(RolePrimary)
	if b.Down() {
		t.Error("AwaitRole took down a backend last seen in the role")
	}
	// The service now wants a replica of a node last seen as primary: out
	// until the next check, which decides at once.
	b.AwaitRole(RoleReplica)
	if !b.Down() {
		t.Error("a node last seen as primary stays eligible for a replica service")
	}
	b.observed(Answer{Role: RolePrimary}, true)
	b.checked(&WrongRoleError{Observed: RolePrimary, Want: RoleReplica}, 3, 3, time.Now())
	if st, _ := b.State(); st != StateWrongRole {
		t.Errorf("after the next check: %v; want wrong role at once", st)
	}
	c := p.Get("s", "c")
	c.AwaitRole(RolePrimary)
	c.observed(Answer{Role: RoleReplica}, true)
	c.checked(&WrongRoleError{Observed: RoleReplica, Want: RolePrimary}, 3, 3, time.Now())
	if st, _ := c.State(); st != StateWrongRole {
		t.Errorf("first check in the wrong role: %v; want wrong role at once", st)
	}
}

// TestAwaitRoleQuiet: a backend already in the wrong role keeps that state
// (no report) when a reload asks again; its next check still decides at once.
func TestAwaitRoleQuiet(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	b.AwaitRole(RoleReplica)
	b.observed(Answer{Role: RolePrimary}, true)
	b.checked(&WrongRoleError{Observed: RolePrimary, Want: RoleReplica}, 3, 3, time.Now())
	for len(changes) > 0 {
		(<-changes).Seen()
	}
	b.AwaitRole(RoleReplica)
	if st, _ := b.State(); st != StateWrongRole || len(changes) != 0 {
		t.Errorf("after AwaitRole again: %v with %d reports; want wrong role, none", st, len(changes))
	}
	b.observed(Answer{Role: RoleReplica}, true)
	b.checked(nil, 3, 3, time.Now())
	if st, _ := b.State(); st != StateUp {
		t.Errorf("after one check in the right role: %v; want up at once", st)
	}
}

// TestFailedReasonCountsItsKind: a down backend's reason counts the checks
// that failed as the latest did, from when that kind of failure began, not
// every failure since the last pass (the operator trial saw "check failed
// 308 times: conn closed" where 308 were wrong-role answers before the
// node died).
func TestFailedReasonCountsItsKind(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	start := time.Date(2026, 12, 1, 3, 4, 5, 0, time.Local)
	wrong := &WrongRoleError{Observed: RoleReplica, Want: RolePrimary}
	b.observed(Answer{Role: RoleReplica}, true)
	for i := range 5 {
		b.checked(wrong, 2, 3, start.Add(time.Duration(i)*time.Second))
	}
	died := start.Add(10 * time.Second)
	b.checked(errors.New("conn closed"), 2, 3, died)
	if _, reason, _ := b.Health(); reason != "check failed once: conn closed" {
		t.Fatalf("reason after the first failure of its kind = %q; want %q (fall counts every failure, the reason only its kind)", reason, "check failed once: conn closed")
	}
	for i := 1; i < 3; i++ {
		b.checked(errors.New("conn closed"), 2, 3, died.Add(time.Duration(i)*time.Second))
	}
	want := "check failed 3 times since " + died.Format("15:04:05") + ": conn closed"
	if _, reason, _ := b.Health(); reason != want {
		t.Errorf("reason = %q; want %q", reason, want)
	}
	b.checked(nil, 2, 3, died.Add(5*time.Second))
	b.checked(errors.New("timeout"), 2, 1, died.Add(6*time.Second))
	if _, reason, _ := b.Health(); reason != "check failed once: timeout" {
		t.Errorf("reason after a pass and one failure = %q; want %q", reason, "check failed once: timeout")
	}
}
