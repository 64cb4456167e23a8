package reload

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"unicode"

	"github.com/rs/zerolog"

	"fulcrum/conf"
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
	settings   []string // every other changed setting: key old→new
	initial    bool     // the first configuration: nothing to compare with
}

// maxListed bounds each list in the report line; the rest is counted.
const maxListed = 20

// skipped are the fields reported in their own lists (membership,
// weights, addresses, schedulers, listeners) or that are not settings.
var skipped = map[string]bool{"File": true, "Digest": true, "Name": true, "Weight": true, "Address": true, "Addr": true,
	"Host": true, "Scheduler": true, "Listen": true, "CheckAddr": true, "CheckHost": true}

// settingChanges lists every setting whose value differs between old and
// next as "key old→new" (keys in snake case, services and backends by
// name), apart from what diff reports in its own lists.
func settingChanges(old, next *conf.Config) []string {
	if old == nil || next == nil {
		return nil
	}
	var out []string
	var walk func(path string, a, b reflect.Value)
	walk = func(path string, a, b reflect.Value) {
		switch {
		case a.Kind() == reflect.Struct && a.Type().PkgPath() == "fulcrum/conf":
			for i := range a.NumField() {
				f := a.Type().Field(i)
				if !f.IsExported() || skipped[f.Name] {
					continue
				}
				key := path
				if !f.Anonymous {
					key = join(path, snake(f.Name))
				}
				walk(key, a.Field(i), b.Field(i))
			}
		case a.Kind() == reflect.Slice && a.Type().Elem().Kind() == reflect.Struct && a.Type().Elem().PkgPath() == "fulcrum/conf":
			byName := map[string]reflect.Value{}
			for i := range b.Len() {
				byName[b.Index(i).FieldByName("Name").String()] = b.Index(i)
			}
			for i := range a.Len() { // only those in both: the rest is membership
				n := a.Index(i).FieldByName("Name").String()
				if bv, ok := byName[n]; ok {
					walk(join(path, n), a.Index(i), bv)
				}
			}
		case !reflect.DeepEqual(a.Interface(), b.Interface()):
			out = append(out, fmt.Sprintf("%s %v→%v", path, show(a), show(b)))
		}
	}
	walk("", reflect.ValueOf(*old), reflect.ValueOf(*next))
	return out
}

// show formats a setting's value for the report.
func show(v reflect.Value) any {
	if v.Kind() == reflect.String && v.String() == "" {
		return `""`
	}
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return "none"
	}
	return v.Interface()
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// snake turns a Go field name into the file's key style: DrainTimeout →
// drain_timeout, MaxConnsPerSource → max_conns_per_source.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 && !unicode.IsUpper(rune(s[i-1])) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func diff(old, next *sched.Table) changes {
	var c changes
	if old == nil {
		c.initial = true
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
	list("settings", c.settings)
	if !c.initial && len(c.services)+len(c.added)+len(c.removed)+len(c.reweighted)+len(c.moved)+len(c.schedulers)+len(c.settings)+len(opened)+len(closed) == 0 {
		e.Bool("unchanged", true) // the file changed, the configuration did not (a comment, a reordering)
	}
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
