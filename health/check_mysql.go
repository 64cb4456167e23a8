package health

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"fulcrum/backend"
)

// mysqlLogin logs in with go-sql-driver/mysql and, with a role wanted, reads
// the read_only flags. Close sends COM_QUIT after the completed handshake,
// so that the server counts no aborted connect and no host error (a client
// that leaves mid-handshake counts toward max_connect_errors and ends up
// blocked).
//
// Without a role or password it logs in as User with no password (HAProxy's
// mysql-check with a user): a server that refuses the user (access denied)
// is still up, but counts an aborted connect, so create the user
// (CREATE USER fulcrum@'10.%', no privileges) to keep the counters still.
func (p *Probe) mysqlLogin(ctx context.Context) (Answer, error) {
	pw, err := p.password()
	if err != nil {
		return Answer{}, err
	}
	cfg := mysql.NewConfig()
	cfg.User = p.User
	if cfg.User == "" {
		cfg.User = "fulcrum"
	}
	cfg.Passwd = pw
	cfg.Net, cfg.Addr = "tcp", p.Addr
	cfg.DialFunc = p.dial
	if cfg.TLS, err = p.tlsConfig(); err != nil { // nil: no TLS
		return Answer{}, err
	}
	cfg.DBName = p.Database
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = p.Timeout, p.Timeout, p.Timeout
	cfg.Logger = quiet{}
	cfg.ConnectionAttributes = "program_name:fulcrum-health"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return Answer{}, fmt.Errorf("mysql: %w", err)
	}
	c, err := conn.Connect(ctx)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && !p.roleWanted() && p.Role != RoleGalera && pw == "" && accessDenied(me.Number) {
			return Answer{}, nil // a live server that does not know the user
		}
		return Answer{}, fmt.Errorf("mysql login as %s: %w", cfg.User, certCause(p.Addr, err))
	}
	defer c.Close() // COM_QUIT
	if p.Role == RoleGalera {
		return Answer{}, galera(ctx, c)
	}
	asked := time.Now() // a primary was at least where it answers from here on
	if !p.roleWanted() && pw == "" {
		return Answer{}, nil
	}
	// One statement for MySQL and MariaDB alike: MariaDB has no
	// super_read_only, and selecting @@global.super_read_only there fails.
	rows, err := c.(driver.QueryerContext).QueryContext(ctx,
		"SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'super_read_only')", nil)
	if err != nil {
		return Answer{}, fmt.Errorf("mysql: %w", err)
	}
	defer rows.Close() // on the early returns; closed below before the next query
	readOnly, seen := false, false
	v := make([]driver.Value, 2)
	for {
		if err := rows.Next(v); err == io.EOF {
			break
		} else if err != nil {
			return Answer{}, fmt.Errorf("mysql: %w", err)
		}
		seen = true
		if val := strings.ToUpper(str(v[1])); val == "ON" || val == "1" {
			readOnly = true
		}
	}
	rows.Close() // the connection takes one statement at a time
	if !seen {
		return Answer{}, fmt.Errorf("mysql: read_only is not shown to user %s", cfg.User)
	}
	q := c.(driver.QueryerContext)
	if !readOnly {
		if p.WAL != nil && p.roleWanted() {
			if pos, ok := mysqlPrimaryPos(ctx, q); ok {
				p.WAL.Primary(asked, 1, pos)
			}
		}
		return Answer{Role: backend.RolePrimary}.noLag(), nil // a primary lags nothing
	}
	a := Answer{Role: backend.RoleReplica}
	if p.Role != backend.RoleReplica {
		return a, nil
	}
	lag, err := p.mysqlLag(ctx, q)
	return p.lagVerdict(a, lag, err)
}

// mysqlLag measures a replica's lag from SHOW SLAVE STATUS (SHOW REPLICA
// STATUS where SLAVE is gone): an IO or SQL thread that is not running is
// an error, whatever Seconds_Behind_Master says (it is NULL or stale
// then); else the larger of Seconds_Behind_Master and how long ago the
// service's primary (while its check answers) was at the binary log
// position the replica has executed, so that a stream that went silent
// while the primary writes cannot read as caught up (Seconds_Behind_Master
// reads 0 once the SQL thread has applied all the IO thread received).
// The check user needs REPLICATION CLIENT (MySQL) or SLAVE MONITOR
// (MariaDB 10.5 and later).
func (p *Probe) mysqlLag(ctx context.Context, q driver.QueryerContext) (time.Duration, error) {
	st, err := showRow(ctx, q, "SHOW SLAVE STATUS")
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1064 { // MySQL 8.4: syntax error, it is REPLICA now
			st, err = showRow(ctx, q, "SHOW REPLICA STATUS")
		}
	}
	if err != nil {
		return 0, fmt.Errorf("mysql: replica status: %w", err)
	}
	if st == nil {
		return 0, fmt.Errorf("replication lag unknown: read_only, but SHOW SLAVE STATUS shows no replication")
	}
	get := func(names ...string) string {
		for _, n := range names {
			if v, ok := st[n]; ok {
				return v
			}
		}
		return ""
	}
	thread := func(name, running, lastErr string) error {
		msg := fmt.Sprintf("replication %s thread is not running (%s)", name, running)
		if lastErr != "" {
			msg += ": " + clip([]byte(lastErr))
		}
		return errors.New(msg)
	}
	if io := get("Slave_IO_Running", "Replica_IO_Running"); io != "Yes" {
		return 0, thread("IO", io, get("Last_IO_Error"))
	}
	if sql := get("Slave_SQL_Running", "Replica_SQL_Running"); sql != "Yes" {
		return 0, thread("SQL", sql, get("Last_SQL_Error"))
	}
	sbm, err := strconv.ParseInt(get("Seconds_Behind_Master", "Seconds_Behind_Source"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("replication lag unknown: Seconds_Behind_Master is NULL")
	}
	lag := time.Duration(sbm) * time.Second
	if pos, ok := binlogPos(get("Relay_Master_Log_File", "Relay_Source_Log_File"), get("Exec_Master_Log_Pos", "Exec_Source_Log_Pos")); ok {
		if gap, known := p.clockLag(pos); known {
			lag = max(lag, gap)
		}
	}
	return lag, nil
}

// mysqlPrimaryPos reads a primary's binary log position (SHOW MASTER
// STATUS); false when binary logging is off or the user may not see it.
func mysqlPrimaryPos(ctx context.Context, q driver.QueryerContext) (uint64, bool) {
	st, err := showRow(ctx, q, "SHOW MASTER STATUS")
	if err != nil {
		st, err = showRow(ctx, q, "SHOW BINARY LOG STATUS") // MySQL 8.4
	}
	if err != nil || st == nil {
		return 0, false
	}
	return binlogPos(st["File"], st["Position"])
}

// binlogPos makes one number of a binary log file and an offset in it:
// the file's sequence number (mysql-bin.000042) above the offset, so that
// positions of one primary's log compare in order.
func binlogPos(file, offset string) (uint64, bool) {
	dot := strings.LastIndexByte(file, '.')
	if dot < 0 {
		return 0, false
	}
	seq, err1 := strconv.ParseUint(file[dot+1:], 10, 32)
	off, err2 := strconv.ParseUint(offset, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return seq<<32 | off, true
}

// showRow runs a SHOW statement of one row and returns it by column name;
// nil when it has no row.
func showRow(ctx context.Context, q driver.QueryerContext, stmt string) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, stmt, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := rows.Columns()
	v := make([]driver.Value, len(cols))
	if err := rows.Next(v); err == io.EOF {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(cols))
	for i, c := range cols {
		if v[i] != nil {
			out[c] = str(v[i])
		}
	}
	for rows.Next(v) == nil { // drain: one replication channel is read
	}
	return out, nil
}

// accessDenied reports whether a MySQL error number means the server refused
// the user (1045 access denied, 1044 no access to the database, 1698 access
// denied without a password on MySQL 8).
func accessDenied(n uint16) bool { return n == 1045 || n == 1044 || n == 1698 }

func str(v driver.Value) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

// quiet drops go-sql-driver's log lines: a probe's errors are its result.
type quiet struct{}

func (quiet) Print(...any) {}
