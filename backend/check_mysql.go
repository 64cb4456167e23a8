package backend

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-sql-driver/mysql"
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
func (p *Probe) mysqlLogin(ctx context.Context) (string, error) {
	pw, err := p.password()
	if err != nil {
		return "", err
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
		return "", err
	}
	cfg.DBName = p.Database
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = p.Timeout, p.Timeout, p.Timeout
	cfg.Logger = quiet{}
	cfg.ConnectionAttributes = "program_name:fulcrum-health"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return "", fmt.Errorf("mysql: %w", err)
	}
	c, err := conn.Connect(ctx)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && !p.roleWanted() && p.Role != RoleGalera && pw == "" && accessDenied(me.Number) {
			return "", nil // a live server that does not know the user
		}
		return "", fmt.Errorf("mysql login as %s: %w", cfg.User, p.tlsCause(err))
	}
	defer c.Close() // COM_QUIT
	if p.Role == RoleGalera {
		return "", galera(ctx, c)
	}
	if !p.roleWanted() && pw == "" {
		return "", nil
	}
	// One statement for MySQL and MariaDB alike: MariaDB has no
	// super_read_only, and selecting @@global.super_read_only there fails.
	rows, err := c.(driver.QueryerContext).QueryContext(ctx,
		"SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'super_read_only')", nil)
	if err != nil {
		return "", fmt.Errorf("mysql: %w", err)
	}
	defer rows.Close()
	readOnly, seen := false, false
	v := make([]driver.Value, 2)
	for {
		if err := rows.Next(v); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("mysql: %w", err)
		}
		seen = true
		if val := strings.ToUpper(str(v[1])); val == "ON" || val == "1" {
			readOnly = true
		}
	}
	if !seen {
		return "", fmt.Errorf("mysql: read_only is not shown to user %s", cfg.User)
	}
	if readOnly {
		return RoleReplica, nil
	}
	return RolePrimary, nil
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
