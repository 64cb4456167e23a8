package health

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"fulcrum/backend"
)

// patroniAgrees asks the node's Patroni whether it sees the node in role,
// the role its database answered in: GET /primary for a primary, GET
// /replica for a replica, 200 meaning yes. The database alone cannot tell
// "still runs as a primary" from "still holds the leader lock": with its
// Patroni dead (and no watchdog) the old leader runs on as a primary while
// another node is promoted, and with Patroni alive but cut off from the
// DCS it is about to be demoted. Patroni alone cannot tell a replica that
// streams from one that has no upstream (its /replica answers 200 for
// both; the database's lag check can). So both must agree.
//
// When they do, it returns a. When Patroni disagrees or does not answer
// it returns no role and an error: the node is down for this service (not
// in the wrong role: which role it holds is unknown), so that on_down
// applies to its sessions. A database in the role the probe does not want
// is already in the wrong role; Patroni is not asked.
func (p *Probe) patroniAgrees(ctx context.Context, a Answer) (Answer, error) {
	if p.Patroni == "" || p.roleWanted() && a.Role != p.Role {
		return a, nil
	}
	path := "/primary"
	if a.Role == backend.RoleReplica {
		path = "/replica"
	}
	unknown := Answer{Lag: a.Lag, LagSet: a.LagSet} // no role, but the lag the check measured
	tc := p.PatroniTLS
	if tc == nil && p.TLS.On { // the checks' TLS settings serve the REST API too
		host, _, _ := net.SplitHostPort(p.Patroni)
		var err error
		if tc, err = p.TLS.Config(host); err != nil {
			return unknown, fmt.Errorf("patroni: %w", err)
		}
	}
	if err := restStatus(ctx, p.netDialer(), p.Patroni, tc, path, 200); err != nil {
		return unknown, fmt.Errorf("database answers as %s, but Patroni does not agree: %w", a.Role, err)
	}
	return a, nil
}

// restStatus sends GET path to a REST API at addr, over TLS when tc is set,
// and compares the status with want. The probe's deadline (ctx) bounds it.
func restStatus(ctx context.Context, d *net.Dialer, addr string, tc *tls.Config, path string, want int) error {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("REST API %s: %w", addr, err)
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // a cancelled probe unblocks at once
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if tc != nil {
		tlc, err := handshake(ctx, c, tc, addr)
		if err != nil {
			return fmt.Errorf("REST API: %w", err) // it names addr
		}
		c = tlc
	}
	if err := httpStatus(c, addr, path, want); err != nil {
		return fmt.Errorf("REST API %s: %w", addr, err)
	}
	return nil
}
