package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// pgRoleQuery tells a primary from a replica and, on a replica, how far
// behind it is. A replica that has replayed all it received is caught up
// (lag 0) however long ago the last transaction was: an idle primary makes
// now() - pg_last_xact_replay_timestamp() grow without any lag. Otherwise
// the lag is the age of the last replayed transaction, or -1 when nothing
// was replayed yet (unknown).
const pgRoleQuery = `SELECT pg_is_in_recovery(),
  CASE WHEN NOT pg_is_in_recovery() THEN 0
       WHEN pg_last_wal_receive_lsn() IS NOT NULL AND pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0
       ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), -1)
  END`

// pgsqlLogin logs in for real with pgconn (which does trust, md5 and
// SCRAM-SHA-256, and TLS when the server offers it) and asks for the role.
// pgconn's Close sends Terminate, so the server logs nothing per probe.
func (p *Probe) pgsqlLogin(ctx context.Context) (string, error) {
	pw, err := p.password()
	if err != nil {
		return "", err
	}
	user, db := p.User, p.Database
	if user == "" {
		user = "fulcrum"
	}
	if db == "" {
		db = "postgres"
	}
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: p.Addr, Path: "/" + db,
		RawQuery: "sslmode=prefer&application_name=fulcrum-health"}
	cfg, err := pgconn.ParseConfig(u.String())
	if err != nil {
		return "", fmt.Errorf("pgsql: %w", err)
	}
	cfg.Password = pw
	cfg.DialFunc = p.netDialer().DialContext
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("pgsql login as %s: %w", user, pgCause(err))
	}
	defer conn.Close(ctx)
	res, err := conn.Exec(ctx, pgRoleQuery).ReadAll()
	if err != nil {
		return "", fmt.Errorf("pgsql: %w", pgCause(err))
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2 {
		return "", fmt.Errorf("pgsql: unexpected answer to the role query")
	}
	row := res[0].Rows[0]
	if string(row[0]) != "t" {
		return RolePrimary, nil
	}
	if p.MaxLag > 0 && p.Role == RoleReplica {
		lag, err := strconv.ParseFloat(string(row[1]), 64)
		if err != nil {
			return RoleReplica, fmt.Errorf("pgsql: replication lag %q: %w", row[1], err)
		}
		if lag < 0 {
			return RoleReplica, fmt.Errorf("replication lag unknown: nothing replayed yet")
		}
		if d := time.Duration(lag * float64(time.Second)); d > p.MaxLag {
			return RoleReplica, fmt.Errorf("replication lag %s is over max_lag %s", d.Round(time.Millisecond), p.MaxLag)
		}
	}
	return RoleReplica, nil
}

// pgCause shortens pgconn's errors to what an operator needs: the server's
// message and SQLSTATE when there is one.
func pgCause(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s (SQLSTATE %s)", strings.TrimSpace(pe.Message), pe.Code)
	}
	return err
}
