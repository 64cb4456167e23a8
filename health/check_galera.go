package health

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"strings"
)

// RoleGalera is the role of a Galera Cluster node that takes writes: a
// mysql check with this role passes only on a node that is Synced
// (wsrep_local_state = 4) in the primary component
// (wsrep_cluster_status = Primary) and not told to refuse clients
// (wsrep_reject_queries = NONE). Every Galera node reads read_only = OFF,
// so role = "primary" cannot tell a donor or a node cut off from the
// quorum from a working one.
const RoleGalera = "galera"

// galeraStates names wsrep_local_state's values as the node's state
// comments do (Galera's WSREP_MEMBER_* states).
var galeraStates = map[string]string{
	"1": "joining", // a state transfer is under way
	"2": "donor",   // donor or desynced (wsrep_desync = ON)
	"3": "joined",  // transfer done, catching up
	"4": "synced",
}

// galera asks a logged-in node for its wsrep state and returns why it must
// not take clients; nil when Synced, Primary and accepting.
func galera(ctx context.Context, c driver.Conn) error {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx,
		"SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_local_state_comment', 'wsrep_cluster_status', 'wsrep_ready')", nil)
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	st, err := nameValues(rows)
	if err != nil {
		return err
	}
	rows, err = c.(driver.QueryerContext).QueryContext(ctx, "SHOW GLOBAL VARIABLES LIKE 'wsrep_reject_queries'", nil)
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	vars, err := nameValues(rows)
	if err != nil {
		return err
	}
	state, ok := st["wsrep_local_state"]
	if !ok {
		return fmt.Errorf("galera: no wsrep status: not a Galera node (wsrep_on = OFF or no provider)")
	}
	if cs := st["wsrep_cluster_status"]; !strings.EqualFold(cs, "Primary") {
		return fmt.Errorf("galera node is non-primary (wsrep_cluster_status %s): cut off from the quorum", cs)
	}
	if state != "4" {
		name := galeraStates[state]
		if name == "" {
			name = "state " + state
		}
		return fmt.Errorf("galera node is %s (wsrep_local_state %s, %s), not synced", name, state, st["wsrep_local_state_comment"])
	}
	if rq := strings.ToUpper(vars["wsrep_reject_queries"]); rq != "" && rq != "NONE" {
		return fmt.Errorf("galera node rejects queries (wsrep_reject_queries %s)", rq)
	}
	return nil
}

// nameValues reads the rows of a SHOW … STATUS or VARIABLES into a map.
func nameValues(rows driver.Rows) (map[string]string, error) {
	defer rows.Close()
	out := map[string]string{}
	v := make([]driver.Value, 2)
	for {
		if err := rows.Next(v); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("mysql: %w", err)
		}
		out[strings.ToLower(str(v[0]))] = str(v[1])
	}
}
