package conf

import (
	"fmt"
	"fulcrum/sched"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Routing by name (docs/routing.md): services that each name what they
// take (sni, alpn) may share a listen address. The rules are checked here,
// with their keys; which names clash is sched's rule (sched.Clashes),
// asked here as sched.NewRoutes asks it, and NewRoutes compiles what
// passes.

// DefaultRoute is the sni name of the default route.
const DefaultRoute = sched.DefaultName

// claim is one service's listing of one address.
type claim struct {
	svc          string // services.NAME
	listen       string // services.NAME.listen[i]
	sni, alpn    []string
	acceptProxy  []netip.Prefix
	proxyTimeout time.Duration
}

// routeKeys reads sni and alpn.
func (w *walker) routeKeys(t *table) (sni, alpn []string) {
	names, _ := t.strs("sni")
	for i, n := range names {
		if err := sched.CheckName(n); err != nil {
			w.errorf(fmt.Sprintf("%s[%d]", t.key("sni"), i), "%v", err)
			continue
		}
		if n = strings.ToLower(n); !slices.Contains(sni, n) {
			sni = append(sni, n)
		}
	}
	if names != nil && len(names) == 0 {
		w.errorf(t.key("sni"), `is empty; name the hosts this service takes, or "*" for the default route`)
	}
	protos, _ := t.strs("alpn")
	for i, p := range protos {
		if p == "" || len(p) > 255 {
			w.errorf(fmt.Sprintf("%s[%d]", t.key("alpn"), i), "a protocol name has 1 to 255 bytes")
			continue
		}
		if !slices.Contains(alpn, p) {
			alpn = append(alpn, p)
		}
	}
	switch {
	case len(protos) > 0 && len(sni) == 0 && len(names) == 0:
		w.errorf(t.key("alpn"), `narrows the routes that sni names; set sni too ("*" is not enough: the default takes every client)`)
	case len(alpn) > 0 && slices.Contains(sni, DefaultRoute):
		w.errorf(t.key("alpn"), `the default route (sni = ["*"]) takes every client; alpn cannot narrow it`)
	}
	return sni, alpn
}

// checkRoutes judges every address listed by more than one service, or by
// a routed one: all of them must be routed, no two may claim one name for a
// protocol both accept, at most one may be the default, and they must agree
// on the PROXY header, which is read before the route is known.
func (w *walker) checkRoutes() {
	for ap, all := range w.claims {
		var cs []claim // one per service
		for _, c := range all {
			if j := slices.IndexFunc(cs, func(o claim) bool { return o.svc == c.svc }); j >= 0 {
				w.errorf(c.listen, "%s is also listened on by %s", ap, cs[j].listen)
				continue
			}
			cs = append(cs, c)
		}
		routed := slices.ContainsFunc(cs, func(c claim) bool { return len(c.sni) > 0 })
		if len(cs) < 2 && !routed {
			continue
		}
		for i, c := range cs {
			if len(c.sni) == 0 {
				other := cs[0]
				if i == 0 {
					other = cs[1]
				}
				w.errorf(c.listen, `%s is also listened on by %s; services may share an address only when each names what it takes (sni = ["db1.example.com"], or ["*"] for the default)`, ap, other.listen)
				continue
			}
			if i > 0 && (!slices.Equal(c.acceptProxy, cs[0].acceptProxy) || c.proxyTimeout != cs[0].proxyTimeout) {
				w.errorf(c.svc+".accept_proxy", "differs from %s's on the shared address %s: the PROXY header is read before the route is known, so they must agree (proxy_timeout too)", cs[0].svc, ap)
			}
		}
		routes := make([]sched.Route, len(cs))
		for i, c := range cs {
			routes[i] = sched.Route{Names: c.sni, ALPN: c.alpn}
		}
		sniKey := func(c claim, n string) string { return fmt.Sprintf("%s.sni[%d]", c.svc, slices.Index(c.sni, n)) }
		for _, cl := range sched.Clashes(routes) {
			c, o := cs[cl.Route], cs[cl.Earlier]
			switch key := sniKey(c, cl.Name); {
			case cl.Name == DefaultRoute:
				w.errorf(key, "%s is already the default route on %s", o.svc, ap)
			case cl.ALPN != "":
				w.errorf(key, "%q with ALPN %q on %s is already taken by %s", cl.Name, cl.ALPN, ap, sniKey(o, cl.Name))
			default:
				w.errorf(key, "%q on %s is already taken by %s", cl.Name, ap, sniKey(o, cl.Name))
			}
		}
	}
}

// Routed returns the listen addresses routed by name (a service on them
// names an sni), each with its services in file order; nil when there are
// none. One pass over the services.
func (cfg *Config) Routed() map[netip.AddrPort][]*Service {
	var out map[netip.AddrPort][]*Service
	for i := range cfg.Services {
		if s := &cfg.Services[i]; len(s.SNI) > 0 {
			if out == nil {
				out = map[netip.AddrPort][]*Service{}
			}
			for _, a := range s.Listen {
				out[a] = nil
			}
		}
	}
	if out == nil {
		return nil
	}
	for i := range cfg.Services {
		s := &cfg.Services[i]
		for _, a := range s.Listen {
			if svcs, ok := out[a]; ok && !slices.Contains(svcs, s) {
				out[a] = append(svcs, s)
			}
		}
	}
	return out
}

// writeRoutes prints each address routed by name with its routes, in the
// order a client's name is tried: exact names, wildcards, the default.
func (cfg *Config) writeRoutes(w io.Writer) {
	routed := cfg.Routed()
	var addrs []netip.AddrPort // in file order
	for _, s := range cfg.Services {
		for _, a := range s.Listen {
			if _, ok := routed[a]; ok && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	for _, a := range addrs {
		svcs := routed[a]
		wait := time.Duration(0)
		for _, s := range svcs {
			wait = max(wait, s.PrereadTimeout)
		}
		fmt.Fprintf(w, "\nroutes on %s  preread_timeout %s\n", a, wait)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  sni\talpn\tservice\t")
		for _, rank := range []func(string) bool{
			func(n string) bool { return !strings.HasPrefix(n, "*") },
			func(n string) bool { return strings.HasPrefix(n, "*.") },
			func(n string) bool { return n == DefaultRoute },
		} {
			for _, s := range svcs {
				alpn := "any"
				if len(s.ALPN) > 0 {
					alpn = strings.Join(s.ALPN, ",")
				}
				for _, n := range s.SNI {
					if rank(n) {
						if n == DefaultRoute {
							n = "* (default: no or unknown SNI, no TLS)"
						}
						fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", n, alpn, s.Name)
					}
				}
			}
		}
		if !slices.ContainsFunc(svcs, func(s *Service) bool { return slices.Contains(s.SNI, DefaultRoute) }) {
			fmt.Fprintf(tw, "  (no default: other clients are closed, reason no-route)\t\t\t\n")
		}
		tw.Flush()
	}
}
