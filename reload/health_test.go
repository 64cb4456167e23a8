package reload

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// backendLine matches the health transition of one backend in the log.
func backendLine(msg, name string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["message"] == msg && m["backend"] == name }
}

// pgbenchRun is one short pgbench run through fulcrum.
type pgbenchRun struct {
	start, end time.Time
	txns       int
	aborted    int
}

var (
	reTxns    = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	reAborted = regexp.MustCompile(`client \d+ aborted`)
)

// TestHealthPostgres: two real PostgreSQL clusters behind check = "pgsql".
// One is killed (pg_ctl stop -m immediate) during pgbench -C runs through
// fulcrum: it is marked down within fall × interval + 1s, gets no new
// connection, and pgbench's failures stop once it is down. Restarted, it
// comes back after rise checks and slow start ramps its share.
func TestHealthPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("long test")
	}
	testkit.CheckLeaks(t)
	pgA, pgB := testkit.StartPostgres(t), testkit.StartPostgres(t)
	pgbench := pgA.Bin("pgbench")
	for _, pg := range []*testkit.Postgres{pgA, pgB} {
		if out, err := exec.Command(pgbench, "-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(pg.Port), "-U", "postgres", "postgres").CombinedOutput(); err != nil {
			t.Fatalf("pgbench -i: %v\n%s", err, out)
		}
	}
	const interval, fall, rise, slow = 300 * time.Millisecond, 3, 2, 6 * time.Second
	health := fmt.Sprintf("slow_start = %q\n[services.pg.health]\ncheck = \"pgsql\"\ninterval = %q\ntimeout = %q\nrise = %d\nfall = %d\n",
		slow, interval, interval, rise, fall)
	r := startRun(t, t.TempDir(), render(svc{name: "pg", listen: []string{"127.0.0.1:0"}, extra: health,
		backends: []be{{"pg-a", pgA.Addr, 10, ""}, {"pg-b", pgB.Addr, 10, ""}}}))
	addr := r.addr("127.0.0.1:0")
	port := addr[strings.LastIndex(addr, ":")+1:]
	b := r.srv.Snapshot().Services[0].Targets[1].B

	var mu sync.Mutex // protects runs
	var runs []pgbenchRun
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // pgbench runs back to back until stop; exits then
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			run := pgbenchRun{start: time.Now()}
			out, _ := exec.Command(pgbench, "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-C", "-S", "-n",
				"-c", "4", "-j", "2", "-T", "1", "postgres").CombinedOutput()
			run.end = time.Now()
			if m := reTxns.FindSubmatch(out); m != nil {
				run.txns, _ = strconv.Atoi(string(m[1]))
			}
			run.aborted = len(reAborted.FindAll(out, -1))
			mu.Lock()
			runs = append(runs, run)
			mu.Unlock()
		}
	}()
	defer func() { close(stop); <-done }()
	waitRuns := func(n int, after time.Time) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) { // runs take a second each
			mu.Lock()
			k := 0
			for _, run := range runs {
				if run.start.After(after) {
					k++
				}
			}
			mu.Unlock()
			if k >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d pgbench runs after %v", k, after)
			}
		}
	}
	waitRuns(2, time.Time{})

	killed := time.Now()
	pgB.Stop(t, "immediate")
	r.logs.Wait(t, 10*time.Second, "pg-b down", backendLine("backend down", "pg-b"))
	detected := time.Since(killed)
	if limit := fall*interval + time.Second; detected > limit {
		t.Errorf("pg-b marked down %v after the kill; want within %v", detected, limit)
	}
	downAt, totalAtDown := time.Now(), b.Stats().Total
	waitRuns(3, downAt)
	if n := b.Stats().Total; n != totalAtDown {
		t.Errorf("pg-b took %d new connections while down", n-totalAtDown)
	}
	mu.Lock()
	before, after, txAfter := 0, 0, 0
	for _, run := range runs {
		switch {
		case run.end.Before(killed):
		case run.start.Before(downAt):
			before += run.aborted
		default:
			after += run.aborted
			txAfter += run.txns
		}
	}
	mu.Unlock()
	if after != 0 || txAfter == 0 {
		t.Errorf("after pg-b was marked down: %d pgbench clients aborted, %d transactions; want none aborted", after, txAfter)
	}
	t.Logf("pg-b killed: marked down after %v; %d pgbench clients failed before that, none after (%d transactions)", detected, before, txAfter)

	restarted := time.Now()
	pgB.Start(t)
	r.logs.Wait(t, 15*time.Second, "pg-b up", backendLine("backend up", "pg-b"))
	up := time.Now()
	t.Logf("pg-b restarted: up %v after pg_ctl start returned", up.Sub(restarted))

	// Slow start: pg-b's share of new connections in 1s windows.
	a := r.srv.Snapshot().Services[0].Targets[0].B
	var shares []float64
	for range int(slow/time.Second) + 2 {
		a0, b0 := a.Stats().Total, b.Stats().Total
		time.Sleep(time.Second) // a measurement window, not synchronisation
		da, db := a.Stats().Total-a0, b.Stats().Total-b0
		if da+db > 0 {
			shares = append(shares, float64(db)/float64(da+db))
		}
	}
	t.Logf("pg-b's share of new connections per second after it came up (slow_start %v): %.2f", slow, shares)
	if len(shares) < 4 || shares[0] > 0.3 || shares[len(shares)-1] < 0.4 {
		t.Errorf("slow start shares %.2f; want under 0.3 at first and about 0.5 at the end", shares)
	}
}

// TestHealthRedis: two real Redis servers behind check = "redis", the
// same kill and restart cycle under redis-benchmark through fulcrum.
func TestHealthRedis(t *testing.T) {
	testkit.CheckLeaks(t)
	ra, rb := testkit.StartRedis(t), testkit.StartRedis(t)
	bench, err := exec.LookPath("redis-benchmark")
	if err != nil {
		t.Skip("redis-benchmark is not installed")
	}
	const interval, fall, rise = 200 * time.Millisecond, 2, 2
	health := fmt.Sprintf("[services.redis.health]\ncheck = \"redis\"\ninterval = %q\ntimeout = %q\nrise = %d\nfall = %d\n", interval, interval, rise, fall)
	r := startRun(t, t.TempDir(), render(svc{name: "redis", listen: []string{"127.0.0.1:0"}, scheduler: "rr", extra: health,
		backends: []be{{"r-a", ra.Addr, 1, ""}, {"r-b", rb.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
	port := addr[strings.LastIndex(addr, ":")+1:]
	benchmark := func() (string, error) { // a new connection per request (-k 0)
		out, err := exec.Command(bench, "-h", "127.0.0.1", "-p", port, "-t", "ping", "-n", "2000", "-c", "4", "-k", "0", "-q").CombinedOutput()
		return string(out), err
	}
	if out, err := benchmark(); err != nil || strings.Contains(out, "Error") {
		t.Fatalf("redis-benchmark before the kill: %v\n%s", err, out)
	}
	b := r.srv.Snapshot().Services[0].Targets[1].B
	killed := time.Now()
	rb.Kill()
	r.logs.Wait(t, 10*time.Second, "r-b down", backendLine("backend down", "r-b"))
	if d, limit := time.Since(killed), fall*interval+time.Second; d > limit {
		t.Errorf("r-b marked down %v after the kill; want within %v", d, limit)
	}
	total := b.Stats().Total
	for i := range 2 {
		if out, err := benchmark(); err != nil || strings.Contains(out, "Error") {
			t.Errorf("redis-benchmark %d with r-b down: %v\n%s", i, err, out)
		}
	}
	if n := b.Stats().Total; n != total {
		t.Errorf("r-b took %d new connections while down", n-total)
	}
	rb.Start(t)
	r.logs.Wait(t, 10*time.Second, "r-b up", backendLine("backend up", "r-b"))
	total = b.Stats().Total
	if out, err := benchmark(); err != nil || strings.Contains(out, "Error") {
		t.Errorf("redis-benchmark after the restart: %v\n%s", err, out)
	}
	if b.Stats().Total == total {
		t.Error("r-b took no connection after it came back")
	}
}

// TestHealthSendExpect: a backend that accepts but never answers is found
// out by send-expect and gets no more connections.
func TestHealthSendExpect(t *testing.T) {
	testkit.CheckLeaks(t)
	mute := testkit.NewServer(t, func(c *net.TCPConn) {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		io.Copy(io.Discard, c) // reads, never answers
	})
	live := testkit.NewServer(t, func(c *net.TCPConn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "PING\r\n" {
				c.Write([]byte("+PONG\r\n"))
			} else {
				c.Write([]byte("live\n"))
			}
		}
	})
	health := "[services.s.health]\ncheck = \"send-expect\"\nsend = \"PING\\r\\n\"\nexpect = \"^\\\\+PONG\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nfall = 2\n"
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr", extra: health,
		backends: []be{{"mute", mute.Addr, 1, ""}, {"live", live.Addr, 1, ""}}}))
	line := r.logs.Wait(t, 5*time.Second, "mute down", backendLine("backend down", "mute"))
	if !strings.Contains(fmt.Sprint(line["reason"]), "check failed 2 times") {
		t.Errorf("reason = %v", line["reason"])
	}
	addr := r.addr("127.0.0.1:0")
	for range 6 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("hello\n"))
		got, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || got != "live\n" {
			t.Fatalf("with mute down: %q, %v", got, err)
		}
	}
}

// TestBackup: the backup serves only while every primary is down, and
// hands back as soon as one returns.
func TestBackup(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	b := testkit.NewServer(t, testkit.Greeter("b"))
	c := testkit.NewServer(t, testkit.Greeter("c"))
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"150ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 2\n"
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr", extra: health,
		backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}, {"c", c.Addr, 1, "backup = true"}}}))
	addr := r.addr("127.0.0.1:0")
	spread := func() map[string]int {
		t.Helper()
		seen := map[string]int{}
		for range 6 {
			name, err := testkit.Greeting(addr)
			if err != nil {
				t.Fatalf("greeting: %v", err)
			}
			seen[name]++
		}
		return seen
	}
	if s := spread(); s["c"] != 0 || s["a"] == 0 || s["b"] == 0 {
		t.Fatalf("with both primaries up: %v; want a and b only", s)
	}
	a.Close()
	r.logs.Wait(t, 5*time.Second, "a down", backendLine("backend down", "a"))
	if s := spread(); s["c"] != 0 || s["b"] != 6 {
		t.Fatalf("with one primary up: %v; want b only, the backup unused", s)
	}
	b.Close()
	r.logs.Wait(t, 5*time.Second, "b down", backendLine("backend down", "b"))
	if s := spread(); s["c"] != 6 {
		t.Fatalf("with every primary down: %v; want the backup", s)
	}
	testkit.NewServerAt(t, a.Addr, testkit.Greeter("a")) // a returns on its port
	r.logs.Wait(t, 5*time.Second, "a up", backendLine("backend up", "a"))
	if s := spread(); s["a"] != 6 {
		t.Fatalf("a primary is back: %v; want it, and the backup handed back", s)
	}
}

// TestPassive: with checks off, max_fails connect failures within
// fail_timeout mark a backend down for fail_timeout; then it is tried again.
func TestPassive(t *testing.T) {
	testkit.CheckLeaks(t)
	live := testkit.NewServer(t, testkit.Greeter("live"))
	dead := testkit.DeadAddr(t)
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr",
		extra: "max_fails = 2\nfail_timeout = \"1s\"", backends: []be{{"dead", dead, 1, ""}, {"live", live.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
	b := r.srv.Snapshot().Services[0].Targets[0].B
	for range 4 {
		if name, err := testkit.Greeting(addr); err != nil || name != "live" {
			t.Fatalf("greeting %q, %v", name, err)
		}
	}
	line := r.logs.Wait(t, 5*time.Second, "dead down", backendLine("backend down", "dead"))
	if !strings.Contains(fmt.Sprint(line["reason"]), "passive") {
		t.Errorf("reason = %v", line["reason"])
	}
	if n := b.Stats().ConnectFails; n != 2 {
		t.Errorf("dead was dialled %d times; want 2, then it is down", n)
	}
	marked := time.Now()
	r.logs.Wait(t, 5*time.Second, "dead back", backendLine("backend up", "dead"))
	if el := time.Since(marked); el < 800*time.Millisecond || el > 2*time.Second {
		t.Errorf("passive mark lifted after %v; want fail_timeout 1s", el)
	}
	for range 2 { // rr's position after the rebuild decides which one comes first
		testkit.Greeting(addr)
	}
	if n := b.Stats().ConnectFails; n < 3 {
		t.Errorf("after fail_timeout dead was dialled %d times in all; want it tried again", n)
	}
}

// TestChecksFollowConfig: check goroutines stop on reload and on removal —
// a removed backend's check target sees no more probes, and 100 reloads
// leave no goroutine behind (the leak check).
func TestChecksFollowConfig(t *testing.T) {
	testkit.CheckLeaks(t)
	var probes [2]atomic.Int64
	targets := make([]string, 2)
	for i := range targets {
		targets[i] = testkit.NewServer(t, func(*net.TCPConn) { probes[i].Add(1) }).Addr
	}
	text := func(k int, withB bool) string {
		health := fmt.Sprintf("[services.s.health]\ncheck = \"tcp\"\ninterval = \"%dms\"\ntimeout = \"50ms\"\n", 100+k%3)
		bs := []be{{"a", targets[0], 1, ""}}
		if withB {
			bs = append(bs, be{"b", targets[1], 1, ""})
		}
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: health, backends: bs})
	}
	r := startRun(t, t.TempDir(), text(0, true))
	for k := 1; k <= 100; k++ {
		writeInPlace(t, r.path, text(k, true))
		r.hup <- struct{}{}
		for r.gen() < uint64(k+1) {
			r.attempt(3 * time.Second)
		}
	}
	writeInPlace(t, r.path, text(0, false)) // b removed
	r.hup <- struct{}{}
	for r.gen() < 102 {
		r.attempt(3 * time.Second)
	}
	before := probes[1].Load()
	aBefore := probes[0].Load()
	time.Sleep(500 * time.Millisecond) // five check intervals: the window in which no probe may come
	if n := probes[1].Load() - before; n > 1 {
		t.Errorf("the removed backend got %d probes after its removal", n)
	}
	if probes[0].Load() == aBefore {
		t.Error("the kept backend is no longer checked")
	}
}
