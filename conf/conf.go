// Package conf turns fulcrum's TOML file into validated, immutable values.
//
// It owns the schema, the defaults and every validation rule. Decoding is
// strict: an unknown key is an error, and Load reports every problem in the
// file at once, each as "file:line: key: reason". conf does no network I/O
// beyond resolving backend host names.
//
// Typical use:
//
//	cfg, err := conf.Load("/etc/fulcrum/fulcrum.toml")
//	if err != nil {
//		// err joins one *conf.Error per problem; print it and refuse the file.
//	}
//
// A *Config is never mutated after Load returns; a reload builds a new one.
package conf

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where the daemon looks for its file without -config.
const DefaultPath = "/etc/fulcrum/fulcrum.toml"

// Schedulers lists the scheduler names a service may use. The sched package
// implements each; a test in reload keeps the two in step.
var Schedulers = []string{"rr", "wrr", "lc"}

// MaxRetries bounds retries: a connection never tries more backends than this plus one.
const MaxRetries = 15

// MaxWeight is the largest backend weight, as in LVS (ipvsadm's 0..65535).
const MaxWeight = 65535

// Config is one validated configuration file.
type Config struct {
	File     string    // the path it was read from; "" from Parse without a name
	Digest   [32]byte  // SHA-256 of the file's bytes
	Log      Log       // the [log] table
	Reload   Reload    // the [reload] table
	Services []Service // in file order
}

// Log is the [log] table.
type Log struct {
	Level  string // debug | info | warn | error; default info
	Format string // auto | json | console; default auto (console on a TTY, else JSON)
	Access bool   // one log line per finished connection; default true
}

// Reload is the [reload] table: how the running daemon notices edits.
type Reload struct {
	Debounce time.Duration // quiet time after the last file event before reading; default 200ms
	Recheck  time.Duration // re-read the file this often in case events were lost; default 30s, 0 = never
}

// Settings are the per-service values that [defaults] supplies and a service
// may override.
type Settings struct {
	Scheduler      string        // one of Schedulers; default "wrr"
	ConnectTimeout time.Duration // per dial attempt; default 3s, never 0
	IdleTimeout    time.Duration // no byte either way for this long closes the connection; 0 (default) = never
	Retries        int           // further backends tried after a failed connect; default 2
	DrainTimeout   time.Duration // how long a removed backend's connections (or all, at shutdown) may run on; default 5m, 0 = no limit
	Copy           string        // how connections copy: "pooled" (default, a goroutine per direction) or "parked" (none while idle)
}

// Service is one [services.NAME] table.
type Service struct {
	Name     string
	Listen   []netip.AddrPort // an unspecified address ([::]) listens on every address
	Settings                  // inherited from [defaults] where not set
	Backends []Backend        // in file order: the order schedulers walk
}

// Backend is one [[services.NAME.backends]] entry.
type Backend struct {
	Name    string         // stable identity across reloads; default: Address
	Address string         // host:port as written
	Addr    netip.AddrPort // Address resolved at load time
	Weight  int            // 0..MaxWeight; default 1; 0 takes no new connections (drain)
}

func builtinSettings() Settings {
	return Settings{Scheduler: "wrr", ConnectTimeout: 3 * time.Second, Retries: 2, DrainTimeout: 5 * time.Minute, Copy: "pooled"}
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse validates data; name is used in error messages and may be "".
func Parse(name string, data []byte) (*Config, error) {
	var tree map[string]any
	md, err := toml.Decode(string(data), &tree)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &Error{File: name, Line: pe.Position.Line, Msg: pe.Message}
		}
		return nil, &Error{File: name, Msg: err.Error()}
	}
	w := &walker{file: name, order: map[string]int{}}
	for i, k := range md.Keys() {
		if len(k) == 2 && k[0] == "services" {
			w.order[k[1]] = i
		}
	}
	cfg := w.config(w.table("", tree))
	cfg.File = name
	cfg.Digest = sha256.Sum256(data)
	if len(w.errs) > 0 {
		w.locateErrors(data)
		slices.SortStableFunc(w.errs, func(a, b *Error) int { return a.Line - b.Line })
		errs := make([]error, len(w.errs))
		for i, e := range w.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

var serviceName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func (w *walker) config(root *table) *Config {
	cfg := &Config{}
	lt := root.sub("log")
	cfg.Log = Log{
		Level:  lt.oneOf("level", "info", "debug", "info", "warn", "error"),
		Format: lt.oneOf("format", "auto", "auto", "json", "console"),
		Access: lt.boolean("access", true),
	}
	lt.done()

	rt := root.sub("reload")
	cfg.Reload = Reload{
		Debounce: rt.duration("debounce", 200*time.Millisecond, 10*time.Millisecond),
		Recheck:  rt.duration("recheck", 30*time.Second, 0),
	}
	if cfg.Reload.Debounce > 10*time.Second {
		w.errorf(rt.key("debounce"), "must be at most 10s, have %s", cfg.Reload.Debounce)
	}
	if r := cfg.Reload.Recheck; r > 0 && r < time.Second {
		w.errorf(rt.key("recheck"), "must be 0 (off) or at least 1s, have %s", r)
	}
	rt.done()

	dt := root.sub("defaults")
	defaults := w.settings(dt, builtinSettings())
	dt.done()

	st := root.sub("services")
	if len(st.m) == 0 {
		// Refused rather than served as "nothing": a file caught truncated
		// mid-write must not close every listener.
		w.errorf("services", "no services; a configuration needs at least one [services.NAME]")
	}
	names := make([]string, 0, len(st.m))
	for name := range st.m {
		names = append(names, name)
	}
	// File order, so that -check and logs list services as written.
	slices.SortFunc(names, func(a, b string) int {
		return w.order[a] - w.order[b]
	})
	listeners := map[netip.AddrPort]string{} // address → key that first claimed it
	for _, name := range names {
		svc := st.sub(name)
		if !serviceName.MatchString(name) {
			w.errorf(svc.path, "service name %q may hold only letters, digits, '_' and '-'", name)
		}
		cfg.Services = append(cfg.Services, w.service(name, svc, defaults, listeners))
		svc.done()
	}
	st.done()
	root.done()
	return cfg
}

func (w *walker) settings(t *table, base Settings) Settings {
	return Settings{
		Scheduler:      t.oneOf("scheduler", base.Scheduler, Schedulers...),
		ConnectTimeout: t.duration("connect_timeout", base.ConnectTimeout, time.Millisecond),
		IdleTimeout:    t.duration("idle_timeout", base.IdleTimeout, 0),
		Retries:        int(t.integer("retries", int64(base.Retries), 0, MaxRetries)),
		DrainTimeout:   t.duration("drain_timeout", base.DrainTimeout, 0),
		Copy:           t.oneOf("copy", base.Copy, "pooled", "parked"),
	}
}

func (w *walker) service(name string, t *table, defaults Settings, listeners map[netip.AddrPort]string) Service {
	s := Service{Name: name, Settings: w.settings(t, defaults)}

	addrs, ok := t.strs("listen")
	if !ok || addrs != nil && len(addrs) == 0 {
		w.errorf(t.key("listen"), `at least one listen address is needed, such as ["127.0.0.1:5432"]`)
	}
	for i, a := range addrs {
		key := fmt.Sprintf("%s[%d]", t.key("listen"), i)
		ap, err := parseListen(a)
		if err != nil {
			w.errorf(key, "%v", err)
			continue
		}
		if ap.Port() != 0 { // port 0 picks a fresh port each time: never a clash
			for other, owner := range listeners {
				if overlaps(other, ap) {
					w.errorf(key, "%s is also listened on by %s", a, owner)
				}
			}
			listeners[ap] = key
		}
		s.Listen = append(s.Listen, ap)
	}

	bts, ok := t.tables("backends")
	if !ok || len(bts) == 0 {
		w.errorf(t.key("backends"), "a service needs at least one backend ([[services.%s.backends]])", name)
	}
	seen := map[string]string{} // backend name → key of its first use
	for _, bt := range bts {
		b := Backend{
			Address: bt.str("address", ""),
			Weight:  int(bt.integer("weight", 1, 0, MaxWeight)),
		}
		b.Name = bt.str("name", b.Address)
		bt.done()
		if b.Address == "" {
			w.errorf(bt.key("address"), `missing; want host:port such as "127.0.0.1:5432"`)
		} else if ap, err := resolve(b.Address); err != nil {
			w.errorf(bt.key("address"), "%v", err)
		} else {
			b.Addr = ap
		}
		if b.Name == "" {
			w.errorf(bt.key("name"), "must not be empty")
		} else if first, dup := seen[b.Name]; dup {
			w.errorf(bt.key("name"), "backend name %q is already used by %s", b.Name, first)
		} else {
			seen[b.Name] = bt.path
		}
		s.Backends = append(s.Backends, b)
	}
	return s
}

// overlaps reports whether binding both a and b would clash: the same
// address, or a wildcard that covers the other ([::] covers IPv4 too, since Go
// listens dual-stack).
func overlaps(a, b netip.AddrPort) bool {
	if a.Port() != b.Port() {
		return false
	}
	covers := func(w, x netip.Addr) bool {
		return w.IsUnspecified() && (w.Is6() || x.Is4())
	}
	return a.Addr() == b.Addr() || covers(a.Addr(), b.Addr()) || covers(b.Addr(), a.Addr())
}

// parseListen accepts "ip:port", "[ipv6]:port" and ":port" (every address).
func parseListen(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not host:port", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: port %q is not a number from 0 to 65535", s, port)
	}
	if host == "" {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p)), nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: listen on an IP address (or \":%s\" for all addresses), not %q", s, port, host)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
}

// lookup resolves host names; a variable so that tests need no DNS.
var lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// resolve parses a backend's host:port, resolving a name to its first address.
func resolve(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not host:port", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.IsUnspecified() {
			return netip.AddrPort{}, fmt.Errorf("%q: cannot connect to the unspecified address", s)
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	if host == "" {
		return netip.AddrPort{}, fmt.Errorf("%q: host is missing", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := lookup(ctx, host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q: cannot resolve %q: %v", s, host, err)
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(p)), nil
}
