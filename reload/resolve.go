package reload

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Backend host names are resolved by the daemon, never by conf, and never
// on the loop that owns the watchdog: all of a file's names at once, in
// parallel, under one deadline (ResolveTimeout), off the loop; then again
// every [reload] resolve_interval and on SIGHUP. A name that does not
// resolve does not refuse the file (HAProxy's init-addr last,libc,none;
// nginx's resolve): a backend that has never had an address is down with
// reason "resolve: …" while the rest of the file applies; one that had an
// address keeps its last one and the failure is logged. An address that
// changes is applied like a reload: the new table dials the new address,
// sessions on the old one run on.

// LookupFunc resolves a host name to its addresses.
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// DefaultResolveTimeout bounds one round of resolution, all names together.
const DefaultResolveTimeout = 5 * time.Second

// resolution is what one host name resolved to: an address, or why not.
type resolution struct {
	addr netip.Addr // valid when the name has (or had) an address
	err  error      // the last attempt's error; nil when it succeeded
}

// names maps host names to their resolutions. A value is never changed
// once shared: a new round makes a new map.
type names map[string]resolution

// lookupAll resolves every name in parallel, all within timeout. A name
// that fails keeps its address from prev, if it had one, with the error
// recorded. The result holds every name in hosts and no other.
func lookupAll(ctx context.Context, lookup LookupFunc, hosts []string, prev names, timeout time.Duration) names {
	out := make(names, len(hosts))
	if len(hosts) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var mu sync.Mutex // protects out
	var wg sync.WaitGroup
	for _, h := range hosts {
		wg.Add(1)
		go func() { // exits when the lookup answers or ctx ends
			defer wg.Done()
			r := resolve(ctx, lookup, h)
			if r.err != nil {
				r.addr = prev[h].addr
			}
			mu.Lock()
			out[h] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// resolve looks h up, returning when ctx ends even if lookup does not.
func resolve(ctx context.Context, lookup LookupFunc, h string) resolution {
	ch := make(chan resolution, 1)
	go func() { // exits when lookup returns; a lookup that ignores ctx is left to finish on its own
		ips, err := lookup(ctx, h)
		switch {
		case err != nil:
			ch <- resolution{err: err}
		case len(ips) == 0:
			ch <- resolution{err: fmt.Errorf("%s has no address", h)}
		default:
			ch <- resolution{addr: ips[0].Unmap()}
		}
	}()
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		return resolution{err: fmt.Errorf("no answer for %s: %w", h, ctx.Err())}
	}
}

// changed reports whether next gives any name another address than n.
func (n names) changed(next names) bool {
	for h, r := range next {
		if n[h].addr != r.addr {
			return true
		}
	}
	return false
}

// addr returns where host:port leads: ap itself when host is "", else the
// resolved address with ap's port; ok is false while host has no address.
func (n names) addr(host string, ap netip.AddrPort) (netip.AddrPort, error) {
	if host == "" {
		return ap, nil
	}
	r, ok := n[host]
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("resolve: %s was not looked up", host)
	}
	if !r.addr.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("resolve: %w", r.err)
	}
	return netip.AddrPortFrom(r.addr, ap.Port()), nil
}

// defaultLookup is the system resolver.
func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// Warnings resolves cfg's host names as the daemon would (system resolver,
// DefaultResolveTimeout) and describes each that has no address, for
// `fulcrum -check`: a warning, since the daemon starts anyway with those
// backends down.
func Warnings(ctx context.Context, hosts []string) []string {
	var out []string
	res := lookupAll(ctx, defaultLookup, hosts, nil, DefaultResolveTimeout)
	for _, h := range hosts {
		if r := res[h]; r.err != nil {
			out = append(out, fmt.Sprintf("%s does not resolve (%v): its backends start down and are retried every resolve_interval", h, r.err))
		}
	}
	return out
}
