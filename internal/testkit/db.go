package testkit

// Real database servers for tests, each in its own temporary directory on
// a free loopback port: a PostgreSQL primary and streaming replicas,
// MariaDB, and Redis with replicas. The test's cleanup stops each server
// and removes its files.
//
//	pg := testkit.StartPostgres(t)   // primary
//	rep := pg.Replica(t)             // pg_basebackup -R, streaming
//	pg.Exec(t, "SELECT 1")
//
// A test whose server is not installed skips, except in CI (CI=true),
// where it fails: CI installs every server.

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the test's own admin connections to MariaDB
	"github.com/jackc/pgx/v5/pgconn"
)

// missing skips the test, or fails it under CI.
func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing, and CI must run this test (.ci/run installs it)", what)
	}
	t.Skipf("%s is not installed", what)
}

// Passwords of the roles StartPostgres creates, and of MariaDB's users.
const (
	MD5Password   = "md5-secret"
	ScramPassword = "scram secret with spaces"
)

// Postgres is one PostgreSQL server of the test's own, on 127.0.0.1.
type Postgres struct {
	Addr string // 127.0.0.1:port
	Port int
	Dir  string // data directory
	Log  string // the server's log file
	root string // the temporary directory holding Dir, Log and the socket
	bin  string // the directory of PostgreSQL's programs
}

// pgBin finds the directory of PostgreSQL's server programs.
func pgBin() string {
	for _, d := range []string{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin"} {
		if _, err := os.Stat(d + "/pg_ctl"); err == nil {
			return d
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// pgRoot makes a temporary directory the postgres user owns.
func pgRoot(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("starting PostgreSQL as its own user needs root")
	}
	dir, err := os.MkdirTemp("", "fulcrum-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	run(t, "chown", "postgres:postgres", dir)
	return dir
}

// StartPostgres starts a primary (no fsync), running as the postgres user
// since PostgreSQL refuses to run as root. Authentication from 127.0.0.1:
// trust for the postgres user and replication, md5 for the role md5user
// (MD5Password), SCRAM-SHA-256 for every other user; scramuser exists with
// ScramPassword, and nopriv exists with no password at all.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	bin := pgBin()
	if bin == "" {
		missing(t, "PostgreSQL")
	}
	root := pgRoot(t)
	p := &Postgres{Port: freePort(t), root: root, bin: bin, Dir: filepath.Join(root, "data"), Log: filepath.Join(root, "log")}
	p.Addr = fmt.Sprintf("127.0.0.1:%d", p.Port)
	runAs(t, bin+"/initdb", "-D", p.Dir, "--auth=trust", "--no-sync", "-U", "postgres")
	p.configure(t)
	hba := "local all all trust\n" +
		"host replication all 127.0.0.1/32 trust\n" +
		"host all postgres 127.0.0.1/32 trust\n" +
		"host all md5user 127.0.0.1/32 md5\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	writeFile(t, filepath.Join(p.Dir, "pg_hba.conf"), hba)
	run(t, "chown", "postgres:postgres", filepath.Join(p.Dir, "pg_hba.conf"))
	p.Start(t)
	t.Cleanup(func() { p.stop(t) })
	p.Exec(t, "SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN PASSWORD '"+MD5Password+"'")
	p.Exec(t, "CREATE ROLE scramuser LOGIN PASSWORD '"+ScramPassword+"'; CREATE ROLE nopriv LOGIN")
	return p
}

func (p *Postgres) configure(t testing.TB) {
	t.Helper()
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 200\n"+
		"shared_buffers = 16MB\nwal_keep_size = 64MB\nlog_connections = off\nlog_disconnections = off\n", p.Port, p.root)
	appendFile(t, filepath.Join(p.Dir, "postgresql.conf"), conf)
}

// Replica makes a streaming replica of p (pg_basebackup -R) and starts it.
func (p *Postgres) Replica(t testing.TB) *Postgres {
	t.Helper()
	root := pgRoot(t)
	r := &Postgres{Port: freePort(t), root: root, bin: p.bin, Dir: filepath.Join(root, "data"), Log: filepath.Join(root, "log")}
	r.Addr = fmt.Sprintf("127.0.0.1:%d", r.Port)
	runAs(t, p.bin+"/pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(p.Port), "-U", "postgres", "-D", r.Dir, "-R", "-X", "stream", "--no-sync")
	r.configure(t)
	r.Start(t)
	t.Cleanup(func() { r.stop(t) })
	return r
}

// Rejoin makes a stopped server a streaming replica of primary, on its own
// port, from a fresh base backup (as an old primary is re-attached after a
// failover), and starts it.
func (p *Postgres) Rejoin(t testing.TB, primary *Postgres) {
	t.Helper()
	if err := os.RemoveAll(p.Dir); err != nil {
		t.Fatal(err)
	}
	runAs(t, p.bin+"/pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(primary.Port), "-U", "postgres", "-D", p.Dir, "-R", "-X", "stream", "--no-sync")
	p.configure(t)
	p.Start(t)
}

// Start starts the server and waits until it accepts connections.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	p.Ctl(t, "start", "-w", "-t", "60", "-l", p.Log)
}

// stop is the cleanup: a server the test stopped already is no error.
func (p *Postgres) stop(t testing.TB) {
	t.Helper()
	out, err := exec.Command("runuser", "-u", "postgres", "--", p.bin+"/pg_ctl", "-D", p.Dir, "stop", "-m", "immediate").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Is server running?") {
		t.Errorf("pg_ctl stop: %v: %s", err, out)
	}
}

// Stop stops the server with the given pg_ctl mode (fast, immediate).
func (p *Postgres) Stop(t testing.TB, mode string) {
	t.Helper()
	p.Ctl(t, "stop", "-w", "-m", mode)
}

// RequireTLS turns ssl on with a fresh self-signed certificate, rejects TCP
// sessions without TLS, and reloads the configuration. (EnableTLS, in
// certs.go, serves a given certificate and still accepts plain sessions.)
func (p *Postgres) RequireTLS(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		missing(t, "openssl")
	}
	cert, key := filepath.Join(p.root, "server.crt"), filepath.Join(p.root, "server.key")
	run(t, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-subj", "/CN=localhost", "-days", "1")
	run(t, "chown", "postgres:postgres", cert, key)
	os.Chmod(key, 0o600)
	appendFile(t, filepath.Join(p.Dir, "postgresql.conf"), fmt.Sprintf("ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n", cert, key))
	hba := filepath.Join(p.Dir, "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, hba, "hostnossl all all 127.0.0.1/32 reject\n"+string(b))
	run(t, "chown", "postgres:postgres", hba)
	p.Ctl(t, "reload")
	WaitFor(t, 10*time.Second, func() error { // a reload gives no event but the setting
		if ssl := p.Exec(t, "SHOW ssl")[0][0]; ssl != "on" {
			return fmt.Errorf("ssl is %q after the reload; want on", ssl)
		}
		return nil
	})
}

// Promote makes a replica a primary and waits until it is one.
func (p *Postgres) Promote(t testing.TB) {
	t.Helper()
	p.Ctl(t, "promote", "-w")
}

// Ctl runs pg_ctl on the server as the postgres user. Stopping a server
// that is not running is no error.
func (p *Postgres) Ctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("runuser", append([]string{"-u", "postgres", "--", p.bin + "/pg_ctl", "-D", p.Dir}, args...)...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Is server running?") {
		t.Fatalf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Bin returns the path of one of PostgreSQL's programs (pgbench, psql…).
func (p *Postgres) Bin(name string) string {
	if _, err := os.Stat(filepath.Join(p.bin, name)); err == nil {
		return filepath.Join(p.bin, name)
	}
	return name
}

// Exec runs sql as postgres over the server's socket and returns the rows
// of the last statement, as text.
func (p *Postgres) Exec(t testing.TB, sql string) [][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", p.root, p.Port))
	if err != nil {
		t.Fatalf("connect to %s: %v", p.Addr, err)
	}
	defer c.Close(ctx)
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("%s on %s: %v", sql, p.Addr, err)
	}
	var rows [][]string
	if len(res) > 0 {
		for _, r := range res[len(res)-1].Rows {
			row := make([]string, len(r))
			for i, v := range r {
				row[i] = string(v)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// LogSince returns what the server logged after offset bytes, and the new
// offset.
func (p *Postgres) LogSince(t testing.TB, offset int64) (string, int64) {
	t.Helper()
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	return string(b[offset:]), int64(len(b))
}

// MariaDB is a mariadbd of the test's own, on 127.0.0.1.
type MariaDB struct {
	Addr   string
	Port   int
	Dir    string
	socket string
	cmd    *exec.Cmd
	done   chan struct{}
	db     *sql.DB
}

// StartMariaDB initialises a data directory with mariadb-install-db and
// starts mariadbd on it, with performance_schema on (for the host cache)
// and max_connect_errors 5, so that a probe that counted toward it would
// soon be blocked. Users: root over the socket; fulcrum with no password
// and no privileges; checker with MD5Password. extra are more mariadbd
// options ("--require-secure-transport=ON").
func StartMariaDB(t testing.TB, extra ...string) *MariaDB {
	t.Helper()
	m := startMariaDB(t, extra...)
	m.Exec(t, "CREATE USER fulcrum@'%'")
	m.Exec(t, "CREATE USER checker@'%' IDENTIFIED BY '"+MD5Password+"'")
	return m
}

// startMariaDB is StartMariaDB without the users.
func startMariaDB(t testing.TB, extra ...string) *MariaDB {
	t.Helper()
	if _, err := exec.LookPath("mariadbd"); err != nil {
		if _, err := os.Stat("/usr/sbin/mariadbd"); err != nil {
			missing(t, "mariadbd (mariadb-server)")
		}
	}
	if _, err := exec.LookPath("mariadb-install-db"); err != nil {
		missing(t, "mariadb-install-db (mariadb-server)")
	}
	if os.Geteuid() != 0 {
		t.Skip("starting MariaDB as its own user needs root")
	}
	dir, err := os.MkdirTemp("", "fulcrum-maria-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	// A temporary directory of its own, so nothing of the server's is in the
	// shared /tmp: there, with another suite's servers beside it, a bootstrap
	// found its temporary table (#sql-temptable-…) gone ("Unknown table
	// 'mysql.tmp_user_sys'").
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "chown", "mysql:mysql", dir, tmp)
	m := &MariaDB{Port: freePort(t), Dir: filepath.Join(dir, "data"), socket: filepath.Join(dir, "sock")}
	m.Addr = fmt.Sprintf("127.0.0.1:%d", m.Port)
	run(t, "mariadb-install-db", "--no-defaults", "--datadir="+m.Dir, "--user=mysql", "--auth-root-authentication-method=socket",
		"--skip-test-db", "--skip-name-resolve", "--tmpdir="+tmp)
	mariadbd := "/usr/sbin/mariadbd"
	if p, err := exec.LookPath("mariadbd"); err == nil {
		mariadbd = p
	}
	m.cmd = exec.Command(mariadbd, "--no-defaults", "--datadir="+m.Dir, "--user=mysql", "--port="+fmt.Sprint(m.Port),
		"--bind-address=127.0.0.1", "--socket="+m.socket, "--pid-file="+filepath.Join(dir, "pid"), "--tmpdir="+tmp,
		"--log-error="+filepath.Join(dir, "err.log"), "--performance-schema=ON", "--max-connect-errors=5",
		"--skip-log-bin", "--innodb-buffer-pool-size=16M", "--skip-innodb-doublewrite", "--innodb-flush-log-at-trx-commit=0")
	m.cmd.Args = append(m.cmd.Args, extra...)
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(m.cmd, m.done) // exits with the process
	t.Cleanup(func() {
		if m.db != nil {
			m.db.Close()
		}
		m.cmd.Process.Kill()
		<-m.done
	})
	m.db, err = sql.Open("mysql", "root@unix("+m.socket+")/?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	m.db.SetMaxIdleConns(1)
	// A margin, not a promise: a Galera joiner opens its socket only after
	// its state transfer, which took over 60 s on a 2-core machine running
	// other suites beside it.
	WaitFor(t, 180*time.Second, func() error { // a starting server gives no event but its socket
		err := m.db.Ping()
		if err != nil {
			select {
			case <-m.done:
				b, _ := os.ReadFile(filepath.Join(dir, "err.log"))
				t.Fatalf("mariadbd exited: %s", b)
			default:
			}
			return fmt.Errorf("mariadbd on %s has not started: %w", m.Addr, err)
		}
		return nil
	})
	return m
}

// Exec runs one statement as root.
func (m *MariaDB) Exec(t testing.TB, stmt string) {
	t.Helper()
	if _, err := m.db.Exec(stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// Status reads one SHOW GLOBAL STATUS counter.
func (m *MariaDB) Status(t testing.TB, name string) int64 {
	t.Helper()
	var k string
	var v int64
	if err := m.db.QueryRow("SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&k, &v); err != nil {
		t.Fatalf("status %s: %v", name, err)
	}
	return v
}

// HostErrors is the host cache's count of connect errors that lead to a
// block (max_connect_errors), summed over hosts.
func (m *MariaDB) HostErrors(t testing.TB) int64 {
	t.Helper()
	var v sql.NullInt64
	if err := m.db.QueryRow("SELECT SUM(SUM_CONNECT_ERRORS) FROM performance_schema.host_cache").Scan(&v); err != nil {
		t.Fatalf("host_cache: %v", err)
	}
	return v.Int64
}

// Redis is a redis-server of the test's own, on 127.0.0.1.
type Redis struct {
	Addr string
	Port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts redis-server with no persistence, plus extra
// arguments ("--requirepass", "x", "--replicaof", "127.0.0.1 6379"). The
// test's cleanup stops it.
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(t, "redis-server")
	}
	r := &Redis{Port: freePort(t)}
	r.Addr = fmt.Sprintf("127.0.0.1:%d", r.Port)
	r.args = append([]string{"--port", fmt.Sprint(r.Port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--dir", t.TempDir(), "--loglevel", "notice"}, extra...)
	r.Start(t)
	t.Cleanup(r.Kill)
	return r
}

// Start starts the server (again, after Kill) and waits until it answers.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	r.cmd = exec.Command("redis-server", r.args...)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(r.cmd, r.done) // exits with the process
	WaitFor(t, 20*time.Second, func() error {
		// A starting server gives no event but its port.
		c, err := net.DialTimeout("tcp", r.Addr, time.Second)
		if err != nil {
			return fmt.Errorf("redis-server on %s has not started: %w", r.Addr, err)
		}
		c.Close()
		return nil
	})
}

// Kill stops the server with SIGKILL and waits for it.
func (r *Redis) Kill() {
	if r.cmd != nil {
		r.cmd.Process.Kill()
		<-r.done
		r.cmd = nil
	}
}

// Do sends one inline command and returns the first line of the reply.
func (r *Redis) Do(t testing.TB, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s\r\n", cmd)
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return strings.TrimSpace(string(buf[:n]))
}

// run runs prog and fails the test on error.
func run(t testing.TB, prog string, args ...string) {
	t.Helper()
	if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// runAs runs prog as the postgres user.
func runAs(t testing.TB, prog string, args ...string) {
	t.Helper()
	run(t, "runuser", append([]string{"-u", "postgres", "--", prog}, args...)...)
}

func writeFile(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t testing.TB, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// freePort returns a port of 127.0.0.1 that was free a moment ago, for a
// server that takes a port number (freePortOn).
func freePort(t testing.TB) int {
	t.Helper()
	return freePortOn(t, "127.0.0.1")
}

// freePortOn returns a port that was free a moment ago on every one of
// hosts, for a server that takes a port number. It is drawn below 32768,
// where the kernel never hands out an ephemeral port: an ephemeral one
// (port 0) can be taken by any outgoing connection of a busy machine
// before the server binds it, which made PostgreSQL fail to start under
// parallel suites. And it is reserved until t ends, by a lock on a file
// named after it (reservePort), so that neither this process nor another
// test binary (go test ./... runs packages at once) draws it again between
// the probe here and the server's bind.
func freePortOn(t testing.TB, hosts ...string) int {
	t.Helper()
	if err := os.MkdirAll(portDir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(portDir, 0o777|os.ModeSticky) // as /tmp: every user's tests share it (fails, harmlessly, when another user made it)
draw:
	for range 100 {
		p := 20000 + rand.IntN(12000)
		release := reservePort(portDir, p)
		if release == nil {
			continue
		}
		for _, h := range hosts {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			if err != nil {
				release()
				continue draw
			}
			ln.Close()
		}
		t.Cleanup(release)
		return p
	}
	t.Fatalf("no port below 32768 free on %v in 100 draws", hosts)
	return 0
}

// portDir holds one file per port handed out, shared by every test binary
// of the machine (a test of the reservation sets its own).
var portDir = filepath.Join(os.TempDir(), "fulcrum-test-ports")

// reservePort takes an exclusive lock on dir/port, which the kernel drops
// when the lock's holder closes it or exits, however it ends. Returns
// what gives it back, or nil when another holds it (or it cannot be
// taken). The files stay: removing one would let two processes lock two
// files of the same name.
func reservePort(dir string, port int) (release func()) {
	// Read-only: a lock needs no more, and another user's file allows it.
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return nil
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil
	}
	return func() { f.Close() }
}
