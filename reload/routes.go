package reload

import (
	"fmt"
	"net/netip"

	"fulcrum/conf"
	"fulcrum/sched"
)

// routes compiles the routes of every address of cfg that routes by name
// (sni) into t, which is not published yet. conf has checked the rules;
// an error here is a bug, reported rather than served.
func routes(cfg *conf.Config, t *sched.Table) error {
	routed := cfg.Routed()
	if routed == nil {
		return nil
	}
	byName := make(map[string]*sched.Service, len(t.Services))
	for _, s := range t.Services {
		byName[s.Name] = s
	}
	for a, svcs := range routed {
		rs := make([]sched.Route, len(svcs))
		for i, s := range svcs {
			rs[i] = sched.Route{Service: byName[s.Name], Names: s.SNI, ALPN: s.ALPN, PrereadTimeout: s.PrereadTimeout}
		}
		r, err := sched.NewRoutes(rs)
		if err != nil {
			return fmt.Errorf("routes on %s: %w", a, err)
		}
		if t.Routed == nil {
			t.Routed = map[netip.AddrPort]*sched.Routes{}
		}
		t.Routed[a] = r
	}
	return nil
}
