package health_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/internal/testkit/proxy"
	"fulcrum/sched"
)

// Roles and cuts through a whole proxy (testkit/proxy): the checks of this
// package decide a backend's role and state, and its cuts end the sessions
// that a role change, a backend down or a primary back condemn.

// redisRole asks, over c, what role the Redis behind it has.
func redisRole(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "AUTH redis-pw\r\nINFO replication\r\n")
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("INFO through fulcrum: %v", err)
		}
		if role, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return role
		}
	}
}

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// backendLine matches a log line with message msg about backend name.
func backendLine(msg, name string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["message"] == msg && m["backend"] == name }
}

// secretFile writes secret to a file of the test's and returns its path.
func secretFile(t *testing.T, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// target finds backend name of service svc in p's running table.
func target(t *testing.T, p *proxy.Proxy, svc, name string) *backend.Backend {
	t.Helper()
	for _, tg := range p.Snapshot().Service(svc).All() {
		if tg.B.Name == name {
			return tg.B
		}
	}
	t.Fatalf("no backend %s in %s", name, svc)
	return nil
}

// awaitState waits until backend name of svc is in state want (and, when
// role is not "-", answers as role), and returns how long it took; the
// checks give no event but the state.
func awaitState(t *testing.T, p *proxy.Proxy, svc, name string, want backend.State, role string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	testkit.WaitFor(t, within, func() error {
		if st, got := target(t, p, svc, name).State(); st != want || (role != "-" && got != role) {
			if role == "-" {
				return fmt.Errorf("backend %s/%s: %v (%s); want %v", svc, name, st, got, want)
			}
			return fmt.Errorf("backend %s/%s: %v (%s); want %v (%s)", svc, name, st, got, want, role)
		}
		return nil
	})
	return time.Since(start)
}

// TestRolesRedis: a role = "primary" service with scheduler first and
// on_down = "close", and a role = "replica" service, over a Redis primary
// and its replica. Each service shows the other node as wrong role;
// REPLICAOF NO ONE and the old primary turned replica move the roles
// within fall × interval + 1s; the session open on the old primary is
// cut, and new connections reach the new primary.
func TestRolesRedis(t *testing.T) {
	testkit.CheckLeaks(t)
	auth := []string{"--requirepass", "redis-pw", "--masterauth", "redis-pw"}
	a := testkit.StartRedis(t, auth...)
	b := testkit.StartRedis(t, append(auth, "--replicaof", "127.0.0.1", port(a.Addr))...)
	pw := secretFile(t, "redis-pw")
	const interval, fall, rise = 200 * time.Millisecond, 2, 1
	rwPair := pair{svc: "rw", listen: "127.0.0.1:0", scheduler: "first", extra: `on_down = "close"`, a: a.Addr, b: b.Addr,
		check: "redis", role: "primary", secret: pw, interval: interval, rise: rise, fall: fall}
	roPair := rwPair
	roPair.svc, roPair.listen, roPair.scheduler, roPair.extra, roPair.role = "ro", "127.0.0.2:0", "rr", "", "replica"
	p := proxy.Start(t, rwPair.String()+roPair.String())
	rw, ro := p.Addr(t, "127.0.0.1:0"), p.Addr(t, "127.0.0.2:0")
	awaitState(t, p, "rw", "a", backend.StateUp, "primary", 10*time.Second)
	awaitState(t, p, "rw", "b", backend.StateWrongRole, "replica", 10*time.Second)
	awaitState(t, p, "ro", "b", backend.StateUp, "replica", 10*time.Second)
	awaitState(t, p, "ro", "a", backend.StateWrongRole, "primary", 10*time.Second)

	old, err := net.Dial("tcp", rw)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if role := redisRole(t, old); role != "master" {
		t.Fatalf("rw reached a %s; want the master", role)
	}
	c, _ := net.Dial("tcp", ro)
	if role := redisRole(t, c); role != "slave" {
		t.Errorf("ro reached a %s; want the replica", role)
	}
	c.Close()

	// Fail over: b becomes the master, a its replica.
	b.Do(t, "AUTH redis-pw\r\nREPLICAOF NO ONE")
	a.Do(t, "AUTH redis-pw\r\nREPLICAOF 127.0.0.1 "+port(b.Addr))
	moved := time.Now()
	awaitState(t, p, "rw", "a", backend.StateWrongRole, "replica", 10*time.Second)
	if d, limit := time.Since(moved), fall*interval+time.Second; d > limit {
		t.Errorf("the old master left rw %v after REPLICAOF; want within %v", d, limit)
	}
	p.Logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		// By the split brain, when b's promotion is seen before a's
		// demotion; else by on_role_change (the default), which comes
		// before on_down.
		return (m["message"] == "sessions cut (on_role_change = close)" || m["message"] == "sessions cut (split brain)") && m["backend"] == "a"
	})
	old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := old.Read(make([]byte, 1)); err == nil {
		t.Errorf("the session on the old master is still open (read %d bytes)", n)
	}
	awaitState(t, p, "rw", "b", backend.StateUp, "primary", 10*time.Second)
	// The state is the backend's at once; the table that picks b is
	// published after it (and refuses while a split brain lasts).
	testkit.WaitFor(t, 10*time.Second, func() error {
		s := p.Snapshot().Service("rw")
		var req sched.Request
		if i, err := s.Picker.Pick(&req); err != nil || s.Targets[i].B.Name != "b" {
			return fmt.Errorf("rw's published table picks %d, %v; want b", i, err)
		}
		return nil
	})
	c, _ = net.Dial("tcp", rw)
	if role := redisRole(t, c); role != "master" {
		t.Errorf("after the failover rw reached a %s; want the new master", role)
	}
	c.Close()
	p.Logs.Wait(t, 5*time.Second, "the wrong-role log line", func(m map[string]any) bool {
		return m["message"] == "backend in the wrong role" && m["backend"] == "a" && m["service"] == "rw" && m["role"] == "replica"
	})
	if s := p.Snapshot().Service("rw").Targets[0].B.Stats(); s.CutClosed != 1 {
		t.Errorf("a's CutClosed = %d; want 1", s.CutClosed)
	}
}

// pair renders a service over two backends, a and b, checked by one kind
// of check: the shape of the role tests and the drill.
type pair struct {
	svc, listen, scheduler, extra string        // extra: more service keys, one per line
	a, b                          string        // the backends' addresses
	check, role, user, secret     string        // secret: the password_file's path ("": none)
	interval                      time.Duration // each check's timeout too
	rise, fall                    int
}

func (p pair) String() string {
	var keys strings.Builder
	for _, kv := range [][2]string{{"user", p.user}, {"password_file", p.secret}} {
		if kv[1] != "" {
			fmt.Fprintf(&keys, "%s = %q\n", kv[0], kv[1])
		}
	}
	return fmt.Sprintf(`[services.%[1]s]
listen = [%[2]q]
scheduler = %[3]q
drain_timeout = "3s"
%[4]s
backends = [{ name = "a", address = %[5]q }, { name = "b", address = %[6]q }]
[services.%[1]s.health]
check = %[7]q
role = %[8]q
%[9]sinterval = %[10]q
timeout = %[10]q
rise = %[11]d
fall = %[12]d
`, p.svc, p.listen, p.scheduler, p.extra, p.a, p.b, p.check, p.role, keys.String(), p.interval, p.rise, p.fall)
}

// tcpChecked is a [services.NAME.health] table of fast tcp checks.
func tcpChecked(name string) string {
	return "[services." + name + ".health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
}

// TestOnUpCloseBackups: with on_up = "close-backups", a session on the
// backup ends when the primary comes back, and the next connection goes
// to the primary.
func TestOnUpCloseBackups(t *testing.T) {
	testkit.CheckLeaks(t)
	h := &testkit.Holder{}
	bk := testkit.NewServer(t, h.Handle)
	primary := testkit.DeadAddr(t)
	p := proxy.Start(t, fmt.Sprintf(`[services.s]
listen = ["127.0.0.1:0"]
scheduler = "first"
drain_timeout = "3s"
on_up = "close-backups"
backends = [{ name = "p", address = %q }, { name = "bk", address = %q, backup = true }]
`, primary, bk.Addr)+tcpChecked("s"))
	addr := p.Addr(t, "127.0.0.1:0")
	p.Logs.Wait(t, 5*time.Second, "p down", backendLine("backend down", "p"))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); got != "in\n" {
		t.Fatalf("via the backup: %q, %v", got, err)
	}
	testkit.NewServerAt(t, primary, testkit.Greeter("p"))
	p.Logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (on_up = close-backups)" && m["backend"] == "bk"
	})
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("the session on the backup is still open (read %d bytes)", n)
	}
	if name, err := testkit.Greeting(addr); name != "p" {
		t.Errorf("after p came back: %q, %v; want p", name, err)
	}
}

// TestOnDownPassive: on_down = "close" cuts a backend's sessions when
// passive failures (a refused dial) mark it down, not only a failed check.
func TestOnDownPassive(t *testing.T) {
	testkit.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 1)
	go func() { // exits when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("a\n"))
			held <- c
		}
	}()
	b := testkit.NewServer(t, testkit.Greeter("b"))
	p := proxy.Start(t, fmt.Sprintf(`[services.s]
listen = ["127.0.0.1:0"]
scheduler = "first"
drain_timeout = "3s"
on_down = "close"
max_fails = 1
retries = 1
backends = [{ name = "a", address = %q }, { name = "b", address = %q }]
`, ln.Addr(), b.Addr))
	front := p.Addr(t, "127.0.0.1:0")
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if s, err := br.ReadString('\n'); s != "a\n" {
		t.Fatalf("first connection: %q, %v; want a", s, err)
	}
	server := <-held
	defer server.Close()
	ln.Close() // a refuses new connections; its open session stays
	if name, err := testkit.Greeting(front); name != "b" {
		t.Errorf("after a refused: %q, %v; want b", name, err)
	}
	p.Logs.Wait(t, 5*time.Second, "the cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (on_down = close)" && m["backend"] == "a" && m["reason"] == "backend down"
	})
	if n, err := br.ReadByte(); err == nil {
		t.Errorf("the session on a is still open (read %q)", n)
	}
}

// TestRolesMariaDB: SET GLOBAL read_only moves a MariaDB node out of a
// role = "primary" service within fall × interval + 1s (its session cut
// with on_down = "close"), and back in when cleared.
func TestRolesMariaDB(t *testing.T) {
	testkit.CheckLeaks(t)
	m := testkit.StartMariaDB(t)
	const interval, fall = 300 * time.Millisecond, 2
	p := proxy.Start(t, fmt.Sprintf(`[services.my]
listen = ["127.0.0.1:0"]
scheduler = "first"
drain_timeout = "3s"
on_down = "close"
backends = [{ name = "m", address = %q }]
[services.my.health]
check = "mysql"
role = "primary"
user = "checker"
password_file = %q
interval = %q
timeout = %q
rise = 1
fall = %d
`, m.Addr, secretFile(t, testkit.MD5Password), interval, interval, fall))
	wait := func(want backend.State) time.Duration {
		t.Helper()
		return awaitState(t, p, "my", "m", want, "-", 10*time.Second)
	}
	b := target(t, p, "my", "m")
	wait(backend.StateUp)
	c, err := net.Dial("tcp", p.Addr(t, "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil { // the server's greeting, through fulcrum
		t.Fatalf("no greeting through fulcrum: %v", err)
	}
	m.Exec(t, "SET GLOBAL read_only = 1")
	if d, limit := wait(backend.StateWrongRole), fall*interval+time.Second; d > limit {
		t.Errorf("read_only took m out after %v; want within %v", d, limit)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			break // cut (the greeting's rest, if any, read first)
		}
	}
	if s := b.Stats(); s.CutClosed != 1 {
		t.Errorf("CutClosed = %d; want 1", s.CutClosed)
	}
	m.Exec(t, "SET GLOBAL read_only = 0")
	wait(backend.StateUp)
}
