package health

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fulcrum/backend"
)

// pgRoleQuery tells a primary from a replica and reads where each is in
// its WAL: a primary's current position and, from the name of its current
// WAL file, its timeline (a promotion moves it at once); a replica's
// replay position. Those positions measure a replica's lag against its
// primary (WALClock), which a replica whose stream went silent cannot
// fake. The last column is the replica's own view, used only while no
// primary has been seen: 0 when it has replayed everything it received
// (however long ago the last transaction was: an idle primary makes
// now() - pg_last_xact_replay_timestamp() grow without any lag), else the
// age of the last replayed transaction, or -1 when nothing was replayed
// yet (unknown). A replica that receives nothing looks caught up in that
// view: hence the primary's position.
const pgRoleQuery = `SELECT pg_is_in_recovery(),
  CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() - '0/0' ELSE pg_current_wal_lsn() - '0/0' END,
  CASE WHEN NOT pg_is_in_recovery() THEN pg_walfile_name(pg_current_wal_lsn()) END,
  CASE WHEN NOT pg_is_in_recovery() THEN 0
       WHEN pg_last_wal_receive_lsn() IS NOT NULL AND pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0
       ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), -1)
  END`

// pgsqlLogin logs in for real with pgconn (which does trust, md5 and
// SCRAM-SHA-256, and TLS when the server offers it, verified and required
// with tls = true) and asks for the role.
// pgconn's Close sends Terminate, so the server logs nothing per probe.
func (p *Probe) pgsqlLogin(ctx context.Context) (Answer, error) {
	pw, err := p.password()
	if err != nil {
		return Answer{}, err
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
		return Answer{}, fmt.Errorf("pgsql: %w", err)
	}
	cfg.Password = pw
	cfg.DialFunc = p.dial
	tcfg, err := p.tlsConfig()
	if err != nil {
		return Answer{}, err
	}
	if tcfg != nil {
		// tls = true: TLS or nothing, verified (sslmode=verify-full with
		// the probe's own roots and client certificate).
		cfg.TLSConfig, cfg.Fallbacks = tcfg, nil
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return Answer{}, fmt.Errorf("pgsql login as %s: %w", user, pgCause(certCause(p.Addr, err)))
	}
	defer conn.Close(ctx)
	asked := time.Now() // the primary was at least where it answers from here on
	res, err := conn.Exec(ctx, pgRoleQuery).ReadAll()
	if err != nil {
		return Answer{}, fmt.Errorf("pgsql: %w", pgCause(err))
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4 {
		return Answer{}, fmt.Errorf("pgsql: unexpected answer to the role query")
	}
	row := res[0].Rows[0]
	wal, _ := strconv.ParseUint(string(row[1]), 10, 64) // NULL (nothing replayed yet): 0
	if string(row[0]) != "t" {
		a := Answer{Role: backend.RolePrimary, Timeline: walTimeline(string(row[2]))}.noLag()
		a, err := p.patroniAgrees(ctx, a)
		if err == nil { // a primary by Patroni's word too: the one to measure lag against
			p.WAL.Primary(asked, a.Timeline, wal)
		}
		return a, err
	}
	a := Answer{Role: backend.RoleReplica}
	// The lag, kept for status and metrics (lagVerdict) whether or not
	// max_lag asks for it: against the primary; with no primary seen
	// (lately: a dead one measures nothing), or nothing replayed, the
	// replica's own view.
	lag, known := p.WAL.Lag(time.Now(), wal, p.lagFresh())
	var lagErr error
	if !known || row[1] == nil {
		own, err := strconv.ParseFloat(string(row[3]), 64)
		switch {
		case err != nil:
			known, lagErr = false, fmt.Errorf("pgsql: replication lag %q: %w", row[3], err)
		case own < 0 || row[1] == nil:
			known, lagErr = false, fmt.Errorf("replication lag unknown: nothing replayed yet")
		default:
			lag, known = time.Duration(own*float64(time.Second)), true
		}
	}
	if a, err = p.lagVerdict(a, lag, lagErr); err != nil {
		return a, err
	}
	return p.patroniAgrees(ctx, a)
}

// lagFresh is how recently a primary must have answered for the lag of a
// replica without max_lag (measured for status and metrics only) to be
// taken against it, as max_lag is for one with it.
const lagFresh = 10 * time.Second

// walTimeline reads the timeline from a WAL file name (its first 8 hex
// digits); 0 when the name is not one.
func walTimeline(name string) uint64 {
	if len(name) != 24 {
		return 0
	}
	tl, err := strconv.ParseUint(name[:8], 16, 32)
	if err != nil {
		return 0
	}
	return tl
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
