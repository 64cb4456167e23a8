package health

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// TestPatroniCheck: with patroni_port, a node is a primary only when its
// database runs as one and its Patroni answers /primary with 200, and a
// replica only when both say replica. Patroni killed on the leader
// (PostgreSQL runs on, as a primary, without a watchdog) and the node is
// no longer a primary: the native check alone still called it one.
func TestPatroniCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Patroni cluster")
	}
	pc := testkit.StartPatroni(t, 2)
	leader := pc.Leader(t)
	replica := pc.Nodes[0]
	if replica == leader {
		replica = pc.Nodes[1]
	}
	probe := func(nd *testkit.PatroniNode, role string, patroni bool) *Probe {
		p := &Probe{Kind: CheckPgSQL, Addr: nd.Addr, Timeout: 5 * time.Second, User: "postgres", Role: role}
		if patroni {
			p.Patroni = nd.REST
		}
		return p
	}
	wantRole(t, "leader, role primary", probe(leader, backend.RolePrimary, true), backend.RolePrimary, "")
	wantRole(t, "leader, role replica", probe(leader, backend.RoleReplica, true), backend.RolePrimary, "")
	wantRole(t, "leader, any role", probe(leader, "", true), backend.RolePrimary, "")
	wantRole(t, "replica, role replica", probe(replica, backend.RoleReplica, true), backend.RoleReplica, "")
	wantRole(t, "replica, role primary", probe(replica, backend.RolePrimary, true), backend.RoleReplica, "")

	// A Patroni that says otherwise: the replica's REST port pointed at
	// the leader's Patroni, whose /replica answers 503.
	p := probe(replica, backend.RoleReplica, true)
	p.Patroni = leader.REST
	wantRole(t, "replica whose Patroni says leader", p, "", "Patroni does not agree: REST API "+leader.REST+": GET /replica: status 503")

	pc.KillPatroni(t, leader)
	wantRole(t, "leader without its Patroni", probe(leader, backend.RolePrimary, true), "", "Patroni does not agree: REST API "+leader.REST)
	if role, err := probe(leader, backend.RolePrimary, false).Check(t.Context()); err != nil || role != backend.RolePrimary {
		t.Errorf("the native check of the leader without its Patroni = %q, %v; want primary (the database runs on)", role, err)
	}
	pc.KillPatroni(t, replica)
	wantRole(t, "replica without its Patroni", probe(replica, backend.RoleReplica, true), "", "Patroni does not agree")
}

// TestSentinelCheck: with sentinels, a node that answers role:master is the
// primary only when a majority of the Sentinels name it; another master
// (here a replica told REPLICAOF NO ONE behind Sentinel's back, as an old
// master is left after SENTINEL FAILOVER) is in the wrong role. Without a
// majority no node is the primary.
func TestSentinelCheck(t *testing.T) {
	ss := testkit.StartSentinel(t, 1)
	m, r := ss.Redis[0], ss.Redis[1]
	probe := func(addr, role string) *Probe {
		return &Probe{Kind: CheckRedis, Addr: addr, Backend: addr, Timeout: 3 * time.Second, Role: role,
			Sentinels: ss.Sentinels, MasterName: ss.Name}
	}
	wantRole(t, "named master", probe(m.Addr, backend.RolePrimary), backend.RolePrimary, "")
	wantRole(t, "replica, role primary", probe(r.Addr, backend.RolePrimary), backend.RoleReplica, "")
	wantRole(t, "replica, role replica", probe(r.Addr, backend.RoleReplica), backend.RoleReplica, "")

	if got := r.Do(t, "REPLICAOF NO ONE"); got != "+OK" {
		t.Fatalf("REPLICAOF NO ONE = %q", got)
	}
	for _, role := range []string{backend.RolePrimary, ""} {
		got, err := probe(r.Addr, role).Check(t.Context())
		var wr *WrongRoleError
		if !errors.As(err, &wr) || got != backend.RolePrimary || !strings.Contains(err.Error(), "3 of 3 name "+m.Addr) {
			t.Errorf("unnamed master, role %q: Check = %q, %v; want primary in the wrong role, named %s", role, got, err, m.Addr)
		}
	}
	wantRole(t, "named master beside an unnamed one", probe(m.Addr, backend.RolePrimary), backend.RolePrimary, "")

	// Two of three Sentinels unreachable: no majority.
	p := probe(m.Addr, backend.RolePrimary)
	p.Sentinels = []string{ss.Sentinels[0], testkit.DeadAddr(t), testkit.DeadAddr(t)}
	wantRole(t, "one Sentinel of three", p, "", "no majority of the 3 Sentinels names a master")
	p.Sentinels, p.MasterName = ss.Sentinels, "nosuchmaster"
	wantRole(t, "unknown master name", p, "", "no majority of the 3 Sentinels names a master for \"nosuchmaster\"")
}

// fakeSentinel answers get-master-addr-by-name with named ("" = a null
// array) and SENTINEL MASTER with the record's address rec and, with
// failing, the failover_in_progress flag, as a Sentinel does in each phase
// of a failover.
func fakeSentinel(t *testing.T, named, rec string, failing bool) string {
	return testkit.NewServer(t, func(c *net.TCPConn) {
		r := bufio.NewReader(c)
		for range 2 {
			v, err := testkit.ReadRESP(r)
			args, _ := v.([]any)
			if err != nil || len(args) < 2 {
				return
			}
			switch args[1] {
			case "get-master-addr-by-name":
				if named == "" {
					c.Write([]byte("*-1\r\n"))
					continue
				}
				h, p, _ := net.SplitHostPort(named)
				c.Write(testkit.RESP(h, p))
			case "MASTER":
				h, p, _ := net.SplitHostPort(rec)
				flags := "master"
				if failing {
					flags = "master,failover_in_progress"
				}
				c.Write(testkit.RESP("name", "mymaster", "ip", h, "port", p, "flags", flags))
			}
		}
	}).Addr
}

// TestSentinelFailoverPhases: through the phases of a failover (old master
// M, promoted replica R, the first Sentinel leading), M stops being the
// primary as soon as the leader is failing it over, R is the primary as
// soon as the leader names it, and neither is before a majority or the
// leader says so.
func TestSentinelFailoverPhases(t *testing.T) {
	const m, r = "127.0.0.1:6379", "127.0.0.1:6380"
	type sentinel struct {
		named, rec string
		failing    bool
	}
	for _, tc := range []struct {
		name string
		s    [3]sentinel
		m, r string // "" = primary, else a substring of the error
	}{
		{"steady", [3]sentinel{{m, m, false}, {m, m, false}, {m, m, false}}, "", "do not name (3 of 3 name " + m},
		{"failover begins", [3]sentinel{{m, m, true}, {m, m, false}, {m, m, false}}, "is failing over", "do not name"},
		{"promotion final at the leader", [3]sentinel{{r, m, true}, {m, m, false}, {m, m, false}}, "is failing over", ""},
		{"others switched, leader reconfiguring", [3]sentinel{{r, m, true}, {r, r, false}, {r, r, false}}, "is failing over", ""},
		{"done", [3]sentinel{{r, r, false}, {r, r, false}, {r, r, false}}, "do not name (3 of 3 name " + r, ""},
		{"no majority", [3]sentinel{{m, m, false}, {r, r, false}, {"", "", false}}, "no majority", "no majority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var addrs []string
			for _, s := range tc.s {
				addrs = append(addrs, fakeSentinel(t, s.named, s.rec, s.failing))
			}
			for _, node := range []struct{ addr, want string }{{m, tc.m}, {r, tc.r}} {
				p := &Probe{Kind: CheckRedis, Backend: node.addr, Role: backend.RolePrimary, Sentinels: addrs, MasterName: "mymaster"}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				err := p.sentinelAgrees(ctx)
				cancel()
				if node.want == "" && err != nil || node.want != "" && (err == nil || !strings.Contains(err.Error(), node.want)) {
					t.Errorf("%s: sentinelAgrees = %v; want %q", node.addr, err, node.want)
				}
			}
		})
	}
}
