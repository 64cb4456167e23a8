package sched

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Routes choose among the services that share one listen address, by the
// server name (SNI) and protocols (ALPN) of the client's TLS ClientHello,
// which the listener peeks at before any backend is dialled.
//
// A route names what it takes: exact host names ("db1.example.com"),
// one-label wildcards ("*.tenants.example.com" takes a.tenants.example.com,
// neither tenants.example.com nor a.b.tenants.example.com), or "*", the
// default, which takes every client no other route takes — those that send
// no SNI or no TLS at all included. Names compare case-insensitively, as
// sent (internationalised names in their xn-- form). A route with ALPN
// takes only clients offering one of its protocols, so two services may
// share a name when their protocols differ.
//
// Precedence: an exact name, then the wildcard of its parent, then the
// default. Among the routes for one name, the client's most preferred
// protocol that a route lists wins, then the name's route without ALPN.
//
// Typical use, per connection (the listener's admission does this):
//
//	svc := rs.Match(hello.SNI, hello.ALPN) // nil: no route, close the client
type Routes struct {
	routes []Route
	exact  map[string][]int // host name → the routes claiming it
	wild   map[string][]int // "tenants.example.com" for "*.tenants.example.com" → routes
	def    int              // the default route; -1 when there is none
	wait   time.Duration    // the longest PrereadTimeout
}

// Route is one service's claim on a shared listen address.
type Route struct {
	Service *Service
	Names   []string // exact names, "*.suffix" wildcards, or "*"; at least one
	ALPN    []string // protocols of which the client must offer one; empty = any
	// PrereadTimeout bounds the wait for the client's first message (the
	// service's preread_timeout). The address waits for the longest of its
	// routes', since the route is not known before; 0 = the listener's
	// default.
	PrereadTimeout time.Duration
}

// DefaultName is the name of the default route.
const DefaultName = "*"

// NewRoutes checks and compiles the routes of one listen address, in
// order. Every route needs a name (a service without one cannot share an
// address), and no two may clash (Clashes). It returns every problem at
// once.
func NewRoutes(routes []Route) (*Routes, error) {
	rs := &Routes{routes: slices.Clone(routes), exact: map[string][]int{}, wild: map[string][]int{}, def: -1}
	var errs []error
	for _, c := range Clashes(routes) {
		a, b := routes[c.Earlier].Service.Name, routes[c.Route].Service.Name
		switch {
		case c.Name == DefaultName:
			errs = append(errs, fmt.Errorf("services %q and %q are both the default (sni = [\"*\"])", a, b))
		case c.ALPN != "":
			errs = append(errs, fmt.Errorf("services %q and %q both claim name %q with ALPN %q", a, b, c.Name, c.ALPN))
		default:
			errs = append(errs, fmt.Errorf("services %q and %q both claim name %q", a, b, c.Name))
		}
	}
	for i, r := range routes {
		rs.wait = max(rs.wait, r.PrereadTimeout)
		name := r.Service.Name
		if len(r.Names) == 0 {
			errs = append(errs, fmt.Errorf("service %q shares the address with routed services but names no sni", name))
			continue
		}
		for _, p := range r.ALPN {
			if p == "" || len(p) > 255 {
				errs = append(errs, fmt.Errorf("service %q: ALPN protocol %q is not 1 to 255 bytes", name, p))
			}
		}
		seen := map[string]bool{}
		for _, n := range r.Names {
			if err := CheckName(n); err != nil {
				errs = append(errs, fmt.Errorf("service %q: %w", name, err))
				continue
			}
			n = strings.ToLower(n)
			if seen[n] {
				continue
			}
			seen[n] = true
			switch {
			case n == DefaultName:
				if len(r.ALPN) > 0 {
					errs = append(errs, fmt.Errorf("service %q: the default route takes every client; it cannot require alpn", name))
				}
				if rs.def < 0 {
					rs.def = i
				}
			case strings.HasPrefix(n, "*."):
				rs.wild[n[2:]] = append(rs.wild[n[2:]], i)
			default:
				rs.exact[n] = append(rs.exact[n], i)
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rs, nil
}

// A Clash is a name that a route claims for clients an earlier route of
// the same address already takes.
type Clash struct {
	Earlier, Route int    // indexes into the routes given; Earlier < Route
	Name           string // as claimed, lowercase: a host name, "*.suffix", or DefaultName
	ALPN           string // the protocol both routes list; "" when neither lists any
}

// Clashes returns, in order, every name two routes of one address claim
// for the same clients: the default twice, or a name claimed by two
// routes without ALPN or by two that list a protocol in common. A route
// with ALPN and one without may share a name: the second takes the
// clients that offer none of the first's protocols. It reads only Names
// and ALPN, and skips the names CheckName refuses. This is the one home of
// the rule: NewRoutes refuses what it finds, and conf reports it at the
// keys that wrote the names.
func Clashes(routes []Route) []Clash {
	var out []Clash
	claimed := map[string][]int{} // name → the routes that claim it so far
	for i, r := range routes {
		seen := map[string]bool{}
		for _, n := range r.Names {
			if CheckName(n) != nil {
				continue
			}
			if n = strings.ToLower(n); seen[n] {
				continue
			}
			seen[n] = true
			for _, j := range claimed[n] {
				if p, ok := overlap(routes[j].ALPN, r.ALPN); ok || n == DefaultName {
					out = append(out, Clash{Earlier: j, Route: i, Name: n, ALPN: p})
				}
			}
			claimed[n] = append(claimed[n], i)
		}
	}
	return out
}

// overlap reports whether two routes of one name would take the same
// client: both without ALPN, or both listing a protocol (which is
// returned). A route with ALPN and one without never do: pick gives the
// listed protocols to the first and the rest to the second.
func overlap(a, b []string) (string, bool) {
	if len(a) == 0 || len(b) == 0 {
		return "", len(a) == 0 && len(b) == 0
	}
	for _, p := range a {
		if slices.Contains(b, p) {
			return p, true
		}
	}
	return "", false
}

// CheckName reports whether n is a name a route may claim: "*", a host
// name, or "*." followed by a host name. Host names are ASCII (an
// internationalised name in its xn-- form), at most 253 bytes, in labels of
// 1 to 63 letters, digits, hyphens or underscores.
func CheckName(n string) error {
	if n == DefaultName {
		return nil
	}
	host := strings.TrimPrefix(n, "*.")
	if strings.Contains(host, "*") {
		return fmt.Errorf("sni %q: a wildcard may only be a whole first label (*.example.com)", n)
	}
	if len(host) == 0 || len(host) > 253 {
		return fmt.Errorf("sni %q: a host name has 1 to 253 bytes", n)
	}
	for _, label := range strings.Split(host, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Errorf("sni %q: labels have 1 to 63 bytes", n)
		}
		for _, c := range []byte(label) {
			switch {
			case c >= 0x80:
				return fmt.Errorf("sni %q: write an internationalised name as clients send it, in its xn-- form", n)
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			default:
				return fmt.Errorf("sni %q: byte %q is not a letter, digit, hyphen or underscore", n, c)
			}
		}
	}
	return nil
}

// Match returns the service for a client that sent server name sni (""
// for none, or no TLS) and offered protocols alpn, or nil when no route
// takes it. It allocates nothing when sni is lowercase, as the listener's
// preread gives it.
func (rs *Routes) Match(sni string, alpn []string) *Service {
	if i := rs.match(sni, alpn); i >= 0 {
		return rs.routes[i].Service
	}
	return nil
}

func (rs *Routes) match(sni string, alpn []string) int {
	if sni != "" {
		sni = strings.ToLower(strings.TrimSuffix(sni, "."))
		if i := rs.pick(rs.exact[sni], alpn); i >= 0 {
			return i
		}
		if dot := strings.IndexByte(sni, '.'); dot > 0 {
			if i := rs.pick(rs.wild[sni[dot+1:]], alpn); i >= 0 {
				return i
			}
		}
	}
	return rs.def
}

// pick chooses among the routes claiming one name: the first protocol the
// client offers that one lists, else the route without ALPN, else -1.
func (rs *Routes) pick(cands []int, alpn []string) int {
	if len(cands) == 0 {
		return -1
	}
	for _, p := range alpn {
		for _, i := range cands {
			if slices.Contains(rs.routes[i].ALPN, p) {
				return i
			}
		}
	}
	for _, i := range cands {
		if len(rs.routes[i].ALPN) == 0 {
			return i
		}
	}
	return -1
}

// List returns the routes in their configured order (for -check and
// /status; not for the connection path).
func (rs *Routes) List() []Route { return slices.Clone(rs.routes) }

// PrereadTimeout is how long the address waits for a client's first
// message: the longest of its routes' (0 = the listener's default).
func (rs *Routes) PrereadTimeout() time.Duration { return rs.wait }

// Default returns the default route's service, or nil.
func (rs *Routes) Default() *Service {
	if rs.def < 0 {
		return nil
	}
	return rs.routes[rs.def].Service
}
