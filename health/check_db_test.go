package health

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// secret writes a password file and returns its path.
func secret(t *testing.T, pw string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantRole runs p and checks the outcome: role "" wants an error containing
// errText; otherwise up in that role, or wrong role when p.Role differs.
func wantRole(t *testing.T, what string, p *Probe, observed, errText string) {
	t.Helper()
	role, err := p.Check(t.Context())
	switch {
	case errText != "":
		if err == nil || !strings.Contains(err.Error(), errText) {
			t.Errorf("%s: Check = %q, %v; want an error with %q", what, role, err, errText)
		}
		return
	case err != nil:
		t.Errorf("%s: Check: %v", what, err)
		return
	case role != observed:
		t.Errorf("%s: role = %q; want %q", what, role, observed)
	}
	verdict := p.Run(t.Context())
	var wr *WrongRoleError
	if wrong := p.Role != "" && p.Role != "any" && p.Role != observed; wrong != errors.As(verdict, &wr) {
		t.Errorf("%s: Run = %v; want wrong role %v", what, verdict, wrong)
	}
}

// waitRole polls p until it observes role: a promotion gives no event the
// test could wait on but the server's own answer.
func waitRole(t *testing.T, p *Probe, role string) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, func() error {
		if got, err := p.Check(t.Context()); err != nil || got != role {
			return fmt.Errorf("role = %q, %v; want %q", got, err, role)
		}
		return nil
	})
}

// TestPostgresRoles: real logins (trust, md5, SCRAM-SHA-256) tell a primary
// from its streaming replica; promotion moves the role; bad credentials
// are clear errors.
func TestPostgresRoles(t *testing.T) {
	pg := testkit.StartPostgres(t)
	rep := pg.Replica(t)
	scram := secret(t, testkit.ScramPassword)
	md5 := secret(t, testkit.MD5Password)
	login := func(addr, user, pwFile, role string) *Probe {
		return &Probe{Kind: "pgsql", Addr: addr, Timeout: 5 * time.Second, User: user, PasswordFile: pwFile, Role: role}
	}
	wantRole(t, "trust on the primary", login(pg.Addr, "postgres", "", "primary"), backend.RolePrimary, "")
	wantRole(t, "scram on the primary", login(pg.Addr, "scramuser", scram, "primary"), backend.RolePrimary, "")
	wantRole(t, "md5 on the primary", login(pg.Addr, "md5user", md5, "replica"), backend.RolePrimary, "")
	wantRole(t, "scram on the replica", login(rep.Addr, "scramuser", scram, "replica"), backend.RoleReplica, "")
	wantRole(t, "md5 on the replica, role primary", login(rep.Addr, "md5user", md5, "primary"), backend.RoleReplica, "")
	wantRole(t, "any, with a password", login(rep.Addr, "scramuser", scram, "any"), backend.RoleReplica, "")

	wantRole(t, "wrong password", login(pg.Addr, "scramuser", md5, "primary"), "", `password authentication failed for user "scramuser"`)
	wantRole(t, "missing password_file", login(pg.Addr, "scramuser", "/nonexistent/pw", "primary"), "", "password_file: open /nonexistent/pw")
	wantRole(t, "no password for a SCRAM user", login(pg.Addr, "nopriv", "", "primary"), "", "nopriv")
	db := login(pg.Addr, "scramuser", scram, "primary")
	db.Database = "nosuchdb"
	wantRole(t, "a database that does not exist", db, "", `database "nosuchdb" does not exist`)

	// max_lag: a caught-up replica of an idle primary has lag 0, however
	// old its last replayed transaction.
	lag := login(rep.Addr, "scramuser", scram, "replica")
	lag.MaxLag = time.Millisecond
	pg.Exec(t, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
	awaitReplay(t, rep)
	waitRole(t, lag, backend.RoleReplica)
	// A replica whose replay is paused falls behind as the primary writes.
	rep.Exec(t, "SELECT pg_wal_replay_pause()")
	pg.Exec(t, "INSERT INTO t VALUES (2)")
	var err error
	testkit.Until(30*time.Second, func() error { // the pause gives no event but the check's answer
		if _, err = lag.Check(t.Context()); err == nil {
			return errors.New("paused replica still within max_lag 1ms")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "over max_lag") {
		t.Errorf("paused replica with max_lag 1ms: %v; want over max_lag", err)
	}
	rep.Exec(t, "SELECT pg_wal_replay_resume()")
	waitRole(t, lag, backend.RoleReplica)

	// Promotion while the old primary runs on: both claim primary.
	rep.Promote(t)
	waitRole(t, login(rep.Addr, "scramuser", scram, "primary"), backend.RolePrimary)
	wantRole(t, "old primary after the promotion", login(pg.Addr, "scramuser", scram, "primary"), backend.RolePrimary, "")
	pg.Stop(t, "immediate")
	wantRole(t, "stopped primary", login(pg.Addr, "scramuser", scram, "primary"), "", "connect")
}

// TestPostgresProbeHygiene: 100 probes of each kind leave nothing in the
// server's log: the login check ends with Terminate, and the check without
// credentials leaves as PostgreSQL expects of a client. With TLS on, the
// server rejects (and logs) any TCP session without it, so a probe that
// skipped TLS would show in the log.
func TestPostgresProbeHygiene(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls), func(t *testing.T) { pgHygiene(t, tls) })
	}
}

func pgHygiene(t *testing.T, tls bool) {
	pg := testkit.StartPostgres(t)
	if tls {
		pg.RequireTLS(t)
	}
	scram := secret(t, testkit.ScramPassword)
	_, off := pg.LogSince(t, 0)
	probes := []*Probe{
		{Kind: "pgsql", Addr: pg.Addr, Timeout: 5 * time.Second, User: "scramuser", PasswordFile: scram, Role: "primary"},
		{Kind: "pgsql", Addr: pg.Addr, Timeout: 5 * time.Second, User: "postgres"},  // trust: logged in, then Terminate
		{Kind: "pgsql", Addr: pg.Addr, Timeout: 5 * time.Second, User: "scramuser"}, // asked for a password: leaves
	}
	for _, p := range probes {
		for i := range 100 {
			if err := p.Run(t.Context()); err != nil {
				t.Fatalf("probe %d as %s: %v", i, p.User, err)
			}
		}
	}
	pg.Exec(t, "SELECT 1") // the log is written by the server's processes; one more session orders it after the probes
	log, _ := pg.LogSince(t, off)
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if line != "" && !strings.Contains(line, "checkpoint") {
			t.Errorf("the server logged during the probes: %s", line)
		}
	}
}

// TestMariaDBRoles: read_only tells a replica from a primary, and flipping
// it moves the role; 200 probes leave Aborted_connects and the host
// error counter unchanged (max_connect_errors is 5, so a probe that
// counted would soon be blocked).
func TestMariaDBRoles(t *testing.T) {
	m := testkit.StartMariaDB(t)
	pw := secret(t, testkit.MD5Password)
	role := &Probe{Kind: "mysql", Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: "primary"}
	wantRole(t, "writable", role, backend.RolePrimary, "")
	m.Exec(t, "SET GLOBAL read_only = 1")
	wantRole(t, "read_only", role, backend.RoleReplica, "")
	m.Exec(t, "SET GLOBAL read_only = 0")
	wantRole(t, "writable again", role, backend.RolePrimary, "")

	wantRole(t, "wrong password", &Probe{Kind: "mysql", Addr: m.Addr, Timeout: 5 * time.Second, User: "checker",
		PasswordFile: secret(t, "wrong"), Role: "primary"}, "", "Access denied for user 'checker'")
	wantRole(t, "missing password_file", &Probe{Kind: "mysql", Addr: m.Addr, Timeout: 5 * time.Second, User: "checker",
		PasswordFile: "/nonexistent/pw", Role: "primary"}, "", "password_file")

	// MariaDB keeps no host cache for 127.0.0.1, so the probes come from
	// 127.0.0.2. First, a client that leaves after the greeting (today's
	// check did) is counted: the counters are live.
	from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	a0 := m.Status(t, "Aborted_connects")
	c, err := from.Dial("tcp", m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Read(make([]byte, 512))
	c.Close()
	// Both counters move when the server's thread sees the EOF; wait for
	// both, so that neither lands inside the probes' window.
	testkit.WaitFor(t, 10*time.Second, func() error { // the server counts it when its thread sees the EOF; no event tells the test
		if h, a := m.HostErrors(t), m.Status(t, "Aborted_connects"); h == 0 || a == a0 {
			return fmt.Errorf("a client leaving after the greeting: host errors %d, Aborted_connects %d (was %d); want both moved", h, a, a0)
		}
		return nil
	})
	m.Exec(t, "FLUSH HOSTS")
	role.dialer = from
	aborted, hostErrs := m.Status(t, "Aborted_connects"), m.HostErrors(t)
	plain := &Probe{Kind: "mysql", Addr: m.Addr, Timeout: 5 * time.Second, User: "fulcrum", dialer: from}
	for i := range 100 {
		if err := plain.Run(t.Context()); err != nil {
			t.Fatalf("probe %d without credentials: %v", i, err)
		}
		if err := role.Run(t.Context()); err != nil {
			t.Fatalf("probe %d with credentials: %v", i, err)
		}
	}
	if got := m.Status(t, "Aborted_connects"); got != aborted {
		t.Errorf("Aborted_connects went from %d to %d over 200 probes", aborted, got)
	}
	if got := m.HostErrors(t); got != hostErrs {
		t.Errorf("host_cache connect errors went from %d to %d over 200 probes", hostErrs, got)
	}
}

// TestRedisRoles: INFO replication tells a master from a replica; REPLICAOF
// NO ONE moves the primary role, and the old primary made a replica
// answers as one.
func TestRedisRoles(t *testing.T) {
	pri := testkit.StartRedis(t, "--requirepass", "redis-pw", "--masterauth", "redis-pw")
	rep := testkit.StartRedis(t, "--requirepass", "redis-pw", "--masterauth", "redis-pw", "--replicaof", "127.0.0.1", pri.Addr[strings.LastIndex(pri.Addr, ":")+1:])
	pw := secret(t, "redis-pw")
	probe := func(addr, role string) *Probe {
		return &Probe{Kind: "redis", Addr: addr, Timeout: 5 * time.Second, PasswordFile: pw, Role: role}
	}
	wantRole(t, "master", probe(pri.Addr, "primary"), backend.RolePrimary, "")
	waitRole(t, probe(rep.Addr, "replica"), backend.RoleReplica) // once its link is up
	wantRole(t, "replica, role primary", probe(rep.Addr, "primary"), backend.RoleReplica, "")
	wantRole(t, "no password", &Probe{Kind: "redis", Addr: pri.Addr, Timeout: 5 * time.Second, Role: "primary"}, "", "wants a password")
	wantRole(t, "wrong password", &Probe{Kind: "redis", Addr: pri.Addr, Timeout: 5 * time.Second, Role: "primary",
		PasswordFile: secret(t, "nope")}, "", "AUTH")

	rep.Do(t, "AUTH redis-pw\r\nREPLICAOF NO ONE")
	waitRole(t, probe(rep.Addr, "primary"), backend.RolePrimary)
	pri.Do(t, "AUTH redis-pw\r\nREPLICAOF 127.0.0.1 "+rep.Addr[strings.LastIndex(rep.Addr, ":")+1:])
	waitRole(t, probe(pri.Addr, "replica"), backend.RoleReplica)
	wantRole(t, "old master, role primary", probe(pri.Addr, "primary"), backend.RoleReplica, "")
}

// TestRedisProbeHygiene: 100 probes of each kind leave nothing in Redis's
// log (at its default level, where a protocol error would show).
func TestRedisProbeHygiene(t *testing.T) {
	log := filepath.Join(t.TempDir(), "redis.log")
	r := testkit.StartRedis(t, "--requirepass", "redis-pw", "--logfile", log)
	// Redis may still be writing its start-up lines after it accepts: the
	// baseline is taken once it has said it is ready.
	var before []byte
	testkit.WaitFor(t, 30*time.Second, func() error { // redis's log file: no event but its content
		if before, _ = os.ReadFile(log); !bytes.Contains(before, []byte("Ready to accept connections")) {
			return fmt.Errorf("redis has not logged that it is ready:\n%s", before)
		}
		return nil
	})
	pw := secret(t, "redis-pw")
	for _, p := range []*Probe{
		{Kind: "redis", Addr: r.Addr, Timeout: 5 * time.Second},                                              // PING, -NOAUTH, QUIT
		{Kind: "redis", Addr: r.Addr, Timeout: 5 * time.Second, PasswordFile: pw, Role: backend.RolePrimary}, // AUTH, INFO, QUIT
	} {
		for i := range 100 {
			if err := p.Run(t.Context()); err != nil {
				t.Fatalf("probe %d: %v", i, err)
			}
		}
	}
	if after, _ := os.ReadFile(log); len(after) != len(before) {
		t.Errorf("redis logged during the probes:\n%s", after[len(before):])
	}
}
