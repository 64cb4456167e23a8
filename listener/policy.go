package listener

import (
	"net/netip"
	"time"

	"fulcrum/sched"
)

// Policy is one service's connection policy: everything admission and the
// session decide about a connection besides which backend takes it. The
// reload package builds it from the configuration beside the table, and
// only this package reads it; a new per-connection setting is a field here
// and the code that reads it, in this package.
type Policy struct {
	AcceptProxy  []netip.Prefix // sources whose PROXY header is read (and required); others may not send one
	ProxyTimeout time.Duration  // for that header to arrive
	Allow, Deny  []netip.Prefix // client access lists: deny wins; an empty allow list allows all

	MaxConns          int           // connections to the service at once; 0 = unlimited
	QueueTimeout      time.Duration // how long a connection may wait for a slot; 0 = refuse at once
	MaxConnsPerSource int           // connections at once from one client address; 0 = unlimited
	AcceptRate        float64       // new connections a second (accept_rate); 0 = unlimited
	AcceptBurst       int           // the rate's bucket (accept_burst); 0 = the rate, at least 1

	ConnectTimeout time.Duration // per dial attempt; 0 = the kernel's
	Retries        int           // further backends tried after a failed connect
	// HoldTimeout is how long a new connection waits for an eligible
	// backend when none is; 0 = close at once.
	HoldTimeout time.Duration

	IdleTimeout time.Duration // no byte either way for this long ends a session; 0 = never
	// HalfCloseTimeout ends a session one direction of which has closed
	// (a FIN passed through) when the other moves no byte for this long
	// (HAProxy's timeout client-fin / server-fin); 0 = never.
	HalfCloseTimeout time.Duration
	// TCP keepalive on both legs of each connection (keepalive.go): the
	// idle time before the first probe (spread ±20% per socket), 0 = off;
	// the interval between probes; unanswered probes before a reset.
	KeepAliveIdle     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveCount    int
	UserTimeout       time.Duration // TCP_USER_TIMEOUT on the client and backend sockets; 0 = the kernel's default

	AccessLog bool // one log line per finished connection, at info level (else debug)

	// Postgres: the service speaks PostgreSQL (a backend checks with
	// pgsql), so that on an address not routed by name a client's first
	// bytes are awaited, within PrereadTimeout (0: 5 s), to tell a
	// CancelRequest (cancel.go). false: nothing is awaited.
	Postgres       bool
	PrereadTimeout time.Duration

	// SourceClient (source = "client"): each dial to a backend is bound to
	// the client's own address (the PROXY address when trusted) with
	// IP_TRANSPARENT (transparent.go). false: fulcrum's own address.
	SourceClient bool
}

// Allowed applies the access lists to a client address: deny wins, then an
// allow list (if any) must hold it.
func (p *Policy) Allowed(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p.Deny {
		if n.Contains(a) {
			return false
		}
	}
	if len(p.Allow) == 0 {
		return true
	}
	for _, n := range p.Allow {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// TrustsProxy reports whether a is a balancer whose PROXY header is read.
func (p *Policy) TrustsProxy(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p.AcceptProxy {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// Snapshot is what the Server serves from, published whole by
// Server.Publish: a scheduler table and the policy of each of its services.
type Snapshot struct {
	*sched.Table
	policy map[*sched.Service]*Policy
}

// NewSnapshot pairs table t with the policies of its services, by service
// name. A service without one gets the zero Policy: no limits, no timeouts.
func NewSnapshot(t *sched.Table, policies map[string]*Policy) *Snapshot {
	s := &Snapshot{Table: t, policy: make(map[*sched.Service]*Policy, len(t.Services))}
	for _, svc := range t.Services {
		p := policies[svc.Name]
		if p == nil {
			p = &Policy{}
		}
		s.policy[svc] = p
	}
	return s
}

// Policy returns svc's policy; svc is a service of s's table.
func (s *Snapshot) Policy(svc *sched.Service) *Policy {
	if p := s.policy[svc]; p != nil {
		return p
	}
	return &zeroPolicy
}

// zeroPolicy is the policy of a service a snapshot was given none for.
var zeroPolicy Policy
