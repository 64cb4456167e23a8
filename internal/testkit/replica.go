package testkit

import (
	"database/sql"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
)

// Pause stops the server with SIGSTOP, as a hung primary is: its sockets
// stay open and nothing answers. Resume continues it.
func (r *Redis) Pause(t testing.TB) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume(t testing.TB) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// StartMariaDBReplica starts a MariaDB primary with a binary log and a
// read_only replica of it, replicating from the primary's position after
// both made their users (so nothing replays twice). checker may read the
// replica's status (SLAVE MONITOR) and the primary's binary log position
// (BINLOG MONITOR).
func StartMariaDBReplica(t testing.TB) (primary, replica *MariaDB) {
	t.Helper()
	return StartMariaDBReplicaVia(t, func(addr string) string { return addr })
}

// StartMariaDBReplicaVia is StartMariaDBReplica with the replica's stream
// going to the address via returns for the primary's (a relay the test
// controls).
func StartMariaDBReplicaVia(t testing.TB, via func(primaryAddr string) string) (primary, replica *MariaDB) {
	t.Helper()
	primary = StartMariaDB(t, "--log-bin=mysql-bin", "--server-id=1")
	replica = StartMariaDB(t, "--server-id=2", "--read-only=ON")
	primary.Exec(t, "CREATE USER repl@'%' IDENTIFIED BY 'repl'")
	primary.Exec(t, "GRANT REPLICATION SLAVE ON *.* TO repl@'%'")
	primary.Exec(t, "GRANT BINLOG MONITOR ON *.* TO checker@'%'")
	primary.Exec(t, "CREATE DATABASE app")
	primary.Exec(t, "CREATE TABLE app.t (id INT PRIMARY KEY AUTO_INCREMENT, v TEXT)")
	replica.Exec(t, "GRANT SLAVE MONITOR ON *.* TO checker@'%'")
	replica.Exec(t, "CREATE DATABASE app")
	replica.Exec(t, "CREATE TABLE app.t (id INT PRIMARY KEY AUTO_INCREMENT, v TEXT)")
	var file string
	var pos int64
	var doDB, ignoreDB sql.NullString
	if err := primary.db.QueryRow("SHOW MASTER STATUS").Scan(&file, &pos, &doDB, &ignoreDB); err != nil {
		t.Fatalf("SHOW MASTER STATUS: %v", err)
	}
	host, port, err := net.SplitHostPort(via(primary.Addr))
	if err != nil {
		t.Fatal(err)
	}
	replica.Exec(t, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%s, MASTER_USER='repl', MASTER_PASSWORD='repl', "+
		"MASTER_LOG_FILE='%s', MASTER_LOG_POS=%d, MASTER_USE_GTID=no", host, port, file, pos))
	replica.Exec(t, "START SLAVE")
	return primary, replica
}

// Relay forwards TCP connections to a target and can freeze the way back
// (target to client) without closing anything: a replication stream that
// goes silent while both ends live on.
type Relay struct {
	Addr   string
	frozen sync.RWMutex // held for writing while frozen; each write back takes it for reading
}

// NewRelay relays connections to target; the test's cleanup closes it
// and its connections and waits for their goroutines.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	r := &Relay{}
	srv := NewServer(t, func(c *net.TCPConn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		done := make(chan struct{})
		go func() { // exits when either side closes
			defer close(done)
			io.Copy(up, c)
			up.Close()
		}()
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				r.frozen.RLock()
				_, werr := c.Write(buf[:n])
				r.frozen.RUnlock()
				if werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		c.Close()
		<-done
	})
	r.Addr = srv.Addr
	return r
}

// Freeze holds back everything from the target until Thaw.
func (r *Relay) Freeze() { r.frozen.Lock() }

// Thaw lets it through again.
func (r *Relay) Thaw() { r.frozen.Unlock() }

// Query runs one statement as root and returns the first column of its
// first row ("" when it has none).
func (m *MariaDB) Query(t testing.TB, stmt string) string {
	t.Helper()
	var v sql.NullString
	if err := m.db.QueryRow(stmt).Scan(&v); err != nil && err != sql.ErrNoRows {
		t.Fatalf("%s: %v", stmt, err)
	}
	return v.String
}
