package reload

// The self-test of source = "client" (listener/transparent.go), run by
// apply before anything is bound or swapped, at start and at every
// reload: a service whose connections come from the client's own address
// works only if this process may make transparent sockets and every
// backend's replies to client addresses come back to fulcrum. Without
// either, HAProxy and nginx show connect timeouts per connection; fulcrum
// refuses the file with the reason and the recipe, and the running table
// keeps serving.
//
// The route is proven the way a connection needs it: a transparent
// connection to each backend from a client address that is not this
// host's, one in each of the service's allow prefixes of the backend's
// family (or, without one, the documentation address 192.0.2.1 or
// 2001:db8::1, which a database host routing everything through fulcrum
// sends back too). Its handshake completes (or is refused: a RST came
// back) only if the backend's reply reached this host and the socket. A
// plain connection from fulcrum's own address, made beside it, tells a
// missing route (the plain one answered) from a backend that is down or
// unreachable, whose route cannot be proven now: that is logged, not
// refused, so that a reload during a database outage is not blocked.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/sched"
)

// maxSourceProbeTimeout bounds each probe: a reply on a working route takes
// one round trip, and a refused file should not hold the reload for long.
const maxSourceProbeTimeout = 3 * time.Second

// maxSourceProbes bounds the allow prefixes probed per backend.
const maxSourceProbes = 8

// maxSourceDials bounds the self-test's dials in flight, so that a service
// of many backends (each probed from up to maxSourceProbes addresses)
// cannot take the descriptors the connections being served need.
const maxSourceDials = 256

// sourceProbe is one transparent connection the self-test makes.
type sourceProbe struct {
	svc    *conf.Service
	t      sched.Target
	from   netip.Addr   // the client address it comes from
	prefix netip.Prefix // the allow prefix from is in; invalid: the documentation address
	err    error        // the transparent connection's outcome
	plain  *plainProbe  // the same backend from fulcrum's own address
}

// plainProbe is a connection to a backend from fulcrum's own address.
type plainProbe struct {
	local netip.Addr // fulcrum's address toward the backend, when it answered
	err   error
}

// checkSources runs the self-test of every service of cfg with source =
// "client" over plan p's backends, and returns a located error (a
// *conf.Error) per service that fails it.
func (m *Manager) checkSources(ctx context.Context, cfg *conf.Config, p *plan) error {
	var probes []*sourceProbe
	var errs []error
	plains := map[netip.AddrPort]*plainProbe{}
	var local map[netip.Addr]bool // this host's addresses, read once a service needs them
	for i := range cfg.Services {
		cs := &cfg.Services[i]
		svc := p.table.Service(cs.Name)
		if !cs.Source.Client || svc == nil {
			continue
		}
		if local == nil {
			local = localAddrs()
		}
		refused := false
		for _, t := range svc.All() {
			if !t.Addr.IsValid() {
				continue // not resolved: no connection is made to it either
			}
			if err := listener.CheckTransparent(t.Addr.Addr()); err != nil {
				errs = append(errs, sourceError(cfg, cs, noCapability(err)))
				refused = true
				break
			}
		}
		if refused {
			continue
		}
		for _, t := range svc.All() {
			if !t.Addr.IsValid() {
				continue
			}
			if plains[t.Addr] == nil {
				plains[t.Addr] = &plainProbe{}
			}
			for _, pr := range probeAddrs(cs.Allow, t.Addr.Addr(), local) {
				probes = append(probes, &sourceProbe{svc: cs, t: t, from: pr.from, prefix: pr.prefix, plain: plains[t.Addr]})
			}
		}
	}
	if len(probes) == 0 {
		return errors.Join(errs...)
	}
	timeout := func(cs *conf.Service) time.Duration { return min(cs.ConnectTimeout, maxSourceProbeTimeout) }
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxSourceDials) // a dial holds one while it is in flight
	for addr, pl := range plains {
		var d time.Duration
		for _, pr := range probes {
			if pr.t.Addr == addr {
				d = max(d, timeout(pr.svc))
			}
		}
		wg.Add(1)
		go func() { // exits when the dial has an outcome, within d
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			dl := net.Dialer{Timeout: d}
			c, err := dl.DialContext(ctx, "tcp", addr.String())
			if err == nil {
				pl.local = c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
				c.Close()
			}
			pl.err = err
		}()
	}
	for _, pr := range probes {
		wg.Add(1)
		go func() { // exits when the dial has an outcome, within the service's probe timeout
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			pr.err = listener.ProbeSource(ctx, pr.from, pr.t.Addr, timeout(pr.svc))
		}()
	}
	wg.Wait()
	failed := map[*conf.Service][]string{}
	var order []*conf.Service
	for _, pr := range probes {
		if answered(pr.err) {
			continue
		}
		if !answered(pr.plain.err) {
			m.log.Warn().Str("service", pr.svc.Name).Str("backend", pr.t.B.Name).Stringer("address", pr.t.Addr).
				AnErr("plain", pr.plain.err).AnErr("transparent", pr.err).
				Msg(`source = "client": the backend does not answer fulcrum's own address either; its return route is not proven, and is tested again at the next reload`)
			continue
		}
		if errors.Is(pr.err, listener.ErrNoTransparent) {
			failed[pr.svc] = append(failed[pr.svc], noCapability(pr.err))
		} else {
			failed[pr.svc] = append(failed[pr.svc], noRoute(pr))
		}
		if len(failed[pr.svc]) == 1 {
			order = append(order, pr.svc)
		}
	}
	for _, cs := range order {
		errs = append(errs, sourceError(cfg, cs, strings.Join(failed[cs], "; ")+routeRecipe))
	}
	return errors.Join(errs...)
}

// answered reports whether a dial's outcome shows that the peer's reply
// came back: it connected, or was refused (a RST came back).
func answered(err error) bool {
	return err == nil || errors.Is(err, syscall.ECONNREFUSED)
}

// sourceError is a self-test failure of service cs, located at its source
// key as conf's errors are.
func sourceError(cfg *conf.Config, cs *conf.Service, msg string) error {
	return &conf.Error{File: cfg.File, Line: cs.Source.Line, Key: "services." + cs.Name + ".source", Msg: msg}
}

// noCapability says what a source = "client" service lacks, and how to
// grant it.
func noCapability(err error) string {
	if !errors.Is(err, listener.ErrNoTransparent) {
		return fmt.Sprintf(`"client": cannot make a transparent socket: %v`, err)
	}
	return `"client" needs CAP_NET_ADMIN to connect from a client's address (IP_TRANSPARENT), and this process lacks it: ` +
		`install the opt-in drop-in (install -D -m 0644 /usr/share/fulcrum/transparent.conf ` +
		`/etc/systemd/system/fulcrum.service.d/transparent.conf; systemctl daemon-reload; systemctl restart fulcrum; ` +
		`docs/databases.md, "The client's own address"), or leave source out`
}

// noRoute says which backend's replies to which client address do not come
// back, with the database host's half of the recipe.
func noRoute(pr *sourceProbe) string {
	via := "FULCRUM_ADDRESS"
	if pr.plain.local.IsValid() {
		via = pr.plain.local.String()
	}
	dst := "default" // the documentation address: everything through fulcrum
	if pr.prefix.IsValid() {
		dst = pr.prefix.String()
	}
	ipcmd := "ip route"
	if pr.from.Is6() {
		ipcmd = "ip -6 route"
	}
	return fmt.Sprintf(`"client": backend %s (%s) answers fulcrum's own address but not a connection from client address %s (%v): `+
		`its replies to clients do not come back through fulcrum. On the database host: %s add %s via %s`,
		pr.t.B.Name, pr.t.Addr, pr.from, pr.err, ipcmd, dst, via)
}

// routeRecipe is fulcrum's host's half of the recipe: replies to a
// transparent socket are marked and delivered locally.
const routeRecipe = `. On fulcrum's host: nft add table inet fulcrum; ` +
	`nft add chain inet fulcrum divert '{ type filter hook prerouting priority mangle; }'; ` +
	`nft add rule inet fulcrum divert meta l4proto tcp socket transparent 1 meta mark set 1; ` +
	`ip rule add fwmark 1 lookup 100; ip route add local 0.0.0.0/0 dev lo table 100 ` +
	`(IPv6: ip -6 rule add fwmark 1 lookup 100; ip -6 route add local ::/0 dev lo table 100). ` +
	`See docs/databases.md, "The client's own address"`

// probeAddr is a client address a probe comes from, and the allow prefix
// it stands for (invalid: none).
type probeAddr struct {
	from   netip.Addr
	prefix netip.Prefix
}

// Documentation addresses (RFC 5737, RFC 3849): the probes' client address
// for a service without an allow prefix of the backend's family.
var (
	probeDoc4 = netip.MustParseAddr("192.0.2.1")
	probeDoc6 = netip.MustParseAddr("2001:db8::1")
)

// probeAddrs returns the client addresses to probe backend address to
// from: one in each of allow's prefixes of to's family (up to
// maxSourceProbes), the highest that is not one of this host's (local) and
// not a broadcast address; or, with none, the documentation address.
func probeAddrs(allow []netip.Prefix, to netip.Addr, local map[netip.Addr]bool) []probeAddr {
	var out []probeAddr
	for _, p := range allow {
		if p.Addr().Is4() != to.Is4() || len(out) == maxSourceProbes {
			continue
		}
		if a, ok := probeIn(p, local); ok {
			out = append(out, probeAddr{a, p})
		}
	}
	if len(out) > 0 {
		return out
	}
	if to.Is4() {
		return []probeAddr{{from: probeDoc4}}
	}
	return []probeAddr{{from: probeDoc6}}
}

// probeIn returns the highest address of p that a host may hold (not an
// IPv4 subnet's broadcast address) and this one does not.
func probeIn(p netip.Prefix, local map[netip.Addr]bool) (netip.Addr, bool) {
	p = p.Masked()
	// The last address: the prefix's with every host bit set.
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	if p.Addr().Is4() && p.Bits() < 31 {
		a = a.Prev() // the broadcast address
	}
	for range 16 {
		if !a.IsValid() || !p.Contains(a) {
			return netip.Addr{}, false
		}
		if !local[a] {
			return a, true
		}
		a = a.Prev()
	}
	return netip.Addr{}, false
}

// localAddrs returns this host's addresses.
func localAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	as, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out
}
