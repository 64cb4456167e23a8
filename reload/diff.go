package reload

import (
	"fmt"
	"net/netip"

	"github.com/rs/zerolog"

	"fulcrum/sched"
)

// changes is what a reload changed, for its one report line.
type changes struct {
	services   []string // "+name" added, "-name" removed
	added      []string // service/backend
	removed    []string // service/backend (N open)
	reweighted []string // service/backend old→new
	moved      []string // service/backend old address→new
	schedulers []string // service old→new
}

// maxListed bounds each list in the report line; the rest is counted.
const maxListed = 20

func diff(old, next *sched.Table) changes {
	var c changes
	if old == nil {
		return c
	}
	for _, ns := range next.Services {
		prev := old.Service(ns.Name)
		if prev == nil {
			c.services = append(c.services, "+"+ns.Name)
			continue
		}
		if prev.Scheduler != ns.Scheduler {
			c.schedulers = append(c.schedulers, fmt.Sprintf("%s %s→%s", ns.Name, prev.Scheduler, ns.Scheduler))
		}
		was := make(map[string]sched.Target, len(prev.Targets))
		for _, t := range prev.All() {
			was[t.B.Name] = t
		}
		for _, t := range ns.All() {
			id := ns.Name + "/" + t.B.Name
			o, ok := was[t.B.Name]
			switch {
			case !ok:
				c.added = append(c.added, id)
			case o.Base != t.Base:
				c.reweighted = append(c.reweighted, fmt.Sprintf("%s %d→%d", id, o.Base, t.Base))
			}
			if ok && o.Addr != t.Addr {
				c.moved = append(c.moved, fmt.Sprintf("%s %s→%s", id, o.Addr, t.Addr))
			}
			delete(was, t.B.Name)
		}
		for _, t := range prev.All() {
			if _, gone := was[t.B.Name]; gone {
				c.removed = append(c.removed, fmt.Sprintf("%s/%s (%d open)", ns.Name, t.B.Name, t.B.Active()))
			}
		}
	}
	for _, prev := range old.Services {
		if next.Service(prev.Name) == nil {
			c.services = append(c.services, "-"+prev.Name)
			for _, t := range prev.All() {
				c.removed = append(c.removed, fmt.Sprintf("%s/%s (%d open)", prev.Name, t.B.Name, t.B.Active()))
			}
		}
	}
	return c
}

// log adds the non-empty lists to e.
func (c changes) log(e *zerolog.Event, opened, closed []netip.AddrPort) {
	list := func(key string, xs []string) {
		if len(xs) == 0 {
			return
		}
		if len(xs) > maxListed {
			xs = append(xs[:maxListed:maxListed], fmt.Sprintf("… %d more", len(xs)-maxListed))
		}
		e.Strs(key, xs)
	}
	list("services", c.services)
	list("added", c.added)
	list("removed", c.removed)
	list("reweighted", c.reweighted)
	list("moved", c.moved)
	list("schedulers", c.schedulers)
	addrs := func(as []netip.AddrPort) []string {
		out := make([]string, len(as))
		for i, a := range as {
			out[i] = a.String()
		}
		return out
	}
	list("listeners_opened", addrs(opened))
	list("listeners_closed", addrs(closed))
}
