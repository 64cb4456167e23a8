package testkit

import (
	"database/sql"
	"fmt"
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
	replica.Exec(t, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%d, MASTER_USER='repl', MASTER_PASSWORD='repl', "+
		"MASTER_LOG_FILE='%s', MASTER_LOG_POS=%d, MASTER_USE_GTID=no", primary.Port, file, pos))
	replica.Exec(t, "START SLAVE")
	return primary, replica
}
