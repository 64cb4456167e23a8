// Package conf turns fulcrum's TOML file into validated, immutable values.
//
// It owns the schema, the defaults and every validation rule. Decoding is
// strict: an unknown key is an error, and Load reports every problem in the
// file at once, each as "file:line: key: reason". conf does no network I/O:
// a backend named by a host name keeps the name (Backend.Host), and the
// daemon resolves it.
//
// Typical use (Example runs it on Parse):
//
//	cfg, err := conf.Load("/etc/fulcrum/fulcrum.toml")
//	if err != nil {
//		// err joins one *conf.Error per problem; print it and refuse the file.
//	}
//
// A *Config is never mutated after Load returns; a reload builds a new one.
package conf

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"fulcrum/health"
	"fulcrum/sched"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where the daemon looks for its file without -config.
const DefaultPath = "/etc/fulcrum/fulcrum.toml"

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
	Admin    Admin     // the [admin] table
	Cluster  Cluster   // the [cluster] table
	Process  Process   // the [process] table
	Services []Service // in file order

	ignored []string // keys the file sets that are accepted and ignored, located, as Warnings gives them
}

// Log is the [log] table.
type Log struct {
	Level  string    // debug | info | warn | error; default info
	Format LogFormat // auto | json | console; default auto (console on a TTY, else JSON)
	Access bool      // one log line per finished connection; default true
}

// Admin is the [admin] table: the HTTP listener for /metrics and /status.
// It is set at start and does not change on reload.
type Admin struct {
	Listen      netip.AddrPort // zero: no admin listener (the default)
	AllowRemote bool           // a non-loopback Listen is refused unless set
	// Hosts are the host names, besides "localhost" and the listen address
	// itself, that a request's Host header may name (any port); others get
	// 421, so that a DNS name rebound to the admin address (DNS
	// rebinding) cannot reach it from a browser. Default none. Lower case.
	Hosts []string
	// StateFile is where the instance drain, `fulcrum set` overrides and
	// each backend's last known health are kept across restarts (an
	// absolute path); "" (the default): nothing is kept.
	StateFile string
	// StateDamaged is what a start does when StateFile exists but cannot
	// be read as a state (cut short, edited by hand): "refuse" (the
	// default) to start, so that the drains and overrides it held are not
	// lost unnoticed, or "start-empty": move it aside and start without
	// them.
	StateDamaged StateDamage
}

// Equal reports whether a and b are the same settings.
func (a Admin) Equal(b Admin) bool {
	return a.Listen == b.Listen && a.AllowRemote == b.AllowRemote && slices.Equal(a.Hosts, b.Hosts) && a.StateFile == b.StateFile && a.StateDamaged == b.StateDamaged
}

// Process is the [process] table: how the daemon runs on its host. It is
// read at start; a reload that changes it warns and keeps the running one.
type Process struct {
	// Loops is how many event loops move the proxied bytes, each with a P
	// of the Go runtime (GOMAXPROCS) of its own. 0 (the default): one per
	// CPU the process may use when it starts (its affinity mask and its
	// cgroup's CPU quota, rounded up), or $GOMAXPROCS when that is set.
	Loops int
}

// MaxLoops bounds [process] loops: far more than any host's CPUs, and few
// enough that a typing error cannot start a million threads.
const MaxLoops = 1024

// Cluster is the [cluster] table: what an instance that shares a floating
// (keepalived) or anycast (BGP) address with others needs.
type Cluster struct {
	// Freebind binds listen addresses that this host does not hold yet
	// (IP_FREEBIND), so that a keepalived backup can listen on the virtual
	// address before it moves here. Default false: such a bind fails.
	Freebind bool
}

// Reload is the [reload] table: how the running daemon notices edits.
type Reload struct {
	Debounce time.Duration // quiet time after the last file event before reading; default 200ms
	Recheck  time.Duration // re-read the file this often in case events were lost; default 30s, 0 = never
	// ResolveInterval is how often backend host names are resolved again
	// (also on SIGHUP); an address that changed is applied like a reload.
	// Default 30s, 0 = only at load and on SIGHUP.
	ResolveInterval time.Duration
}

// Settings are the per-service values that [defaults] supplies and a service
// may override.
type Settings struct {
	Scheduler      sched.Kind    // one of sched.Names; default "wrr"
	ConnectTimeout time.Duration // per dial attempt; default 3s, never 0
	IdleTimeout    time.Duration // no byte either way for this long closes the connection; 0 (default) = never
	Retries        int           // further backends tried after a failed connect; default 2
	DrainTimeout   time.Duration // how long a removed backend's connections (or all, at shutdown) may run on; default 5m, 0 = no limit
	Choices        int           // p2c: backends drawn per pick, 1..sched.MaxChoices; default 2
	HashKey        string        // sh, mh: "ip" (default) or "ip_port"
	TableSize      int           // mh: lookup table size, a prime larger than the number of backends; default 65537

	Health       Health        // active checks; a backend may override any field
	MaxFails     int           // passive: this many connect failures within FailTimeout mark a backend down; default 3, 0 = off
	FailTimeout  time.Duration // passive: the window, and how long the backend stays down; default 10s
	SlowStart    time.Duration // a backend that comes up ramps its weight from 10% to 100% over this; default 0 = off
	MaxConns     int           // connections to the whole service at once; 0 (default) = unlimited
	QueueTimeout time.Duration // how long a connection may wait for a free slot when every eligible backend (or the service) is full; 0 (default) = refuse at once
	OnDown       OnDown        // "keep" (default) | "close": end a backend's sessions when it goes down or into the wrong role; a backend may override
	OnUp         OnUp          // "keep" (default) | "close-backups": when a primary backend comes up, end the sessions on backups; a backend may override
	OnRoleChange OnRoleChange  // "close" (default) | "keep": end a backend's sessions when its checks see it change role (promoted, demoted); a backend may override
	SplitBrain   SplitBrain    // "refuse" (default) | "first" | "newest": what a service whose checks want role "primary" does when more than one backend claims it
	HoldTimeout  time.Duration // when no backend is eligible, a new connection waits this long for one; 0 (default) = close it at once
	UserTimeout  time.Duration // TCP_USER_TIMEOUT on both legs: unacknowledged data for this long ends the connection; 0 (default) = the kernel's

	ProxyProtocol     int            // the PROXY header version sent to backends (proxy_protocol "none", "v1", "v2"): 0 (default) = none, 1 or 2; a backend may override
	AcceptProxy       []netip.Prefix // read a PROXY header (v1 or v2) from these sources, and refuse one from any other
	ProxyTimeout      time.Duration  // for that header to arrive; default 3s
	Allow             []netip.Prefix // if set, only these client addresses may connect
	Deny              []netip.Prefix // these may not; deny wins over allow
	MaxConnsPerSource int            // connections at once from one client address; 0 (default) = unlimited
	AcceptRate        float64        // new connections per second for the service (token bucket); 0 (default) = unlimited
	AcceptBurst       int            // the bucket's size; default: the rate, at least 1

	// TCP keepalive on both legs of every connection: a peer silent for
	// KeepAliveIdle (spread ±20% per socket, so that connections opened
	// together never probe together) is probed every KeepAliveInterval, and
	// the connection is reset after KeepAliveCount unanswered probes.
	// Defaults 1m, 15s, 4: a vanished peer is found within about 2 minutes.
	// KeepAliveIdle 0 turns keepalive off.
	KeepAliveIdle     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveCount    int

	// HalfCloseTimeout ends a connection one direction of which has closed
	// (a FIN was passed on) while the other moves no byte for this long, as
	// HAProxy's timeout client-fin/server-fin do; default 2m, 0 = never.
	HalfCloseTimeout time.Duration

	// PrereadTimeout, on an address routed by name (sni), bounds the wait
	// for the client's first message (docs/routing.md); default 5s.
	PrereadTimeout time.Duration

	// Protocol is what the service's clients speak, where fulcrum looks
	// into it: "auto" (default): "postgres" when a backend checks with
	// pgsql, else "tcp"; "postgres": PostgreSQL, whose cancel requests are
	// sent to the backends running the query (docs/databases.md); "tcp":
	// bytes, never looked into.
	Protocol Protocol
}

// Health is a [health] table: how to check that a backend is up.
type Health struct {
	Check    health.CheckKind // none (default) | tcp | send-expect | pgsql | redis | mysql | http
	Interval time.Duration    // between checks; default 2s
	Timeout  time.Duration    // for one check; default 1s, at most Interval
	Rise     int              // consecutive successes to come up; default 2
	Fall     int              // consecutive failures to go down; default 3
	Port     int              // check this port on the backend's host; 0 = the backend's port
	Address  string           // check this host:port instead of the backend ("" = the backend)
	Send     string           // send-expect: bytes to send first
	Expect   *regexp.Regexp   // send-expect: what the answer must match (compiled); nil = none
	Path     string           // http: the path to GET; default "/"
	Status   int              // http: the status that means up; default 200
	User     string           // pgsql, mysql: the user to log in as; default "fulcrum"

	Role         string        // "any" (default) | "primary" | "replica" | "galera" (mysql only): the role a pgsql, mysql or redis check requires
	PasswordFile string        // pgsql, mysql, redis: a file holding the password (never the password itself); "" = none. Relative to the config file's directory
	Database     string        // pgsql: the database to log in to; "" = "postgres". mysql: none
	MaxLag       time.Duration // pgsql, mysql, redis with role "replica": a replica further behind is down; 0 (default) = no limit

	PatroniPort int      // pgsql: the port of the node's Patroni REST API on the check host, which must agree with the database's role; 0 (default) = the database alone
	Sentinels   []string // redis: host:port of the Sentinels watching MasterName; a master is the primary only when a majority of them name it. nil (default) = the node's own answer
	MasterName  string   // redis, with Sentinels: the name the Sentinels monitor the master under; required with Sentinels

	// TLS is tls, tls_ca, tls_cert, tls_key, tls_server_name and
	// tls_verify (default true): every kind over TLS, verified. Paths are
	// relative to the config file's directory. Zero = no TLS.
	TLS       health.TLS
	SendProxy bool // send_proxy: checks send the PROXY header the backend's proxy_protocol names; default false
}

// Roles are the values of [health] role.
var Roles = []string{RoleAny, RolePrimary, RoleReplica, RoleGalera}

// schedulerNames are the names the scheduler key takes: sched's.
var schedulerNames = func() []string {
	out := make([]string, len(sched.Names))
	for i, k := range sched.Names {
		out[i] = string(k)
	}
	return out
}()

// checkNames are the names the check key takes: backend's check kinds.
var checkNames = func() []string {
	out := make([]string, len(health.CheckKinds))
	for i, k := range health.CheckKinds {
		out[i] = string(k)
	}
	return out
}()

// Service is one [services.NAME] table.
type Service struct {
	Name     string
	Listen   []netip.AddrPort // an unspecified address ([::]) listens on every address
	Settings                  // inherited from [defaults] where not set
	Backends []Backend        // in file order: the order schedulers walk
	Fallback string           // another service whose eligible backends take this one's connections while none of its own is eligible; "" = none

	// Failback is scheduler = "first"'s sticky writer (failback): ""
	// (default) moves new connections back to the first backend as soon as
	// it is up again; "never" keeps them on the current writer until it
	// fails; "after" until the preferred backend has been up for
	// FailbackAfter; "manual" until an operator promotes a backend
	// (`fulcrum set SERVICE/BACKEND writer`).
	Failback      Failback
	FailbackAfter time.Duration

	// SNI routes by name (docs/routing.md): the server names this service
	// takes on its listen addresses, which it may then share with other
	// routed services. Exact names, "*.suffix" one-label wildcards, or "*",
	// the default route; lowercased. nil (default): the service owns its
	// addresses alone.
	SNI []string
	// ALPN narrows SNI: the client must offer one of these protocols. nil
	// (default): any protocol, or none.
	ALPN []string

	// Source is where connections to the backends come from (source.go):
	// zero (default): fulcrum's own address; "client": the client's.
	Source Source
}

// Backend is one [[services.NAME.backends]] entry.
type Backend struct {
	Name    string         // stable identity across reloads; default: Address
	Address string         // host:port as written
	Host    string         // the host name to resolve; "" when Address is an IP address
	Addr    netip.AddrPort // Address when it is an IP address; for a host name only the port is set
	Weight  int            // 0..MaxWeight; default 1; 0 takes no new connections (drain)

	Backup        bool           // serves only while no primary backend of the service is up
	MaxConns      int            // connections to this backend at once, dials included; 0 (default) = unlimited
	SlowStart     time.Duration  // from the service unless set here
	MaxFails      int            // from the service unless set here
	FailTimeout   time.Duration  // from the service unless set here
	Health        Health         // the service's [health] with this backend's overrides
	CheckHost     string         // the host name checks go to, to resolve; "" when CheckAddr is final
	CheckAddr     netip.AddrPort // where checks go: Health.Address, or Addr with Health.Port (for a CheckHost only the port)
	ProxyProtocol int            // from the service unless set here
	OnDown        OnDown         // from the service unless set here
	OnUp          OnUp           // from the service unless set here
	OnRoleChange  OnRoleChange   // from the service unless set here
}

func builtinSettings() Settings {
	return Settings{Scheduler: "wrr", ConnectTimeout: 3 * time.Second, Retries: 2, DrainTimeout: 5 * time.Minute,
		MaxFails: 3, FailTimeout: 10 * time.Second, ProxyTimeout: 3 * time.Second,
		Health:  Health{Check: health.CheckNone, Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3, Path: "/", Status: 200, User: "fulcrum", Role: RoleAny},
		Choices: sched.DefaultChoices, HashKey: "ip", TableSize: sched.DefaultTableSize, OnDown: OnDownKeep, OnUp: OnUpKeep, OnRoleChange: OnRoleChangeClose, SplitBrain: SplitBrainRefuse, Protocol: ProtocolAuto,
		KeepAliveIdle: time.Minute, KeepAliveInterval: 15 * time.Second, KeepAliveCount: 4, HalfCloseTimeout: 2 * time.Minute,
		PrereadTimeout: 5 * time.Second}
}

// Exposed says why the file at path is unsafe to trust, or "": a file that
// group or others may write lets them route traffic anywhere.
func Exposed(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return fmt.Sprintf("%s is writable by %s (mode %#o): anyone who can write it controls where traffic goes; chmod go-w it", path, map[bool]string{true: "others", false: "its group"}[m&0o002 != 0], m)
	}
	return ""
}

// MaxSize is the largest configuration file Read accepts: 16 MiB, some
// thousand times a large real one, and far below what would hold the reload
// loop for seconds and grow the process by hundreds of megabytes.
const MaxSize = 16 << 20

// ErrTooLarge is returned by Read for a file larger than MaxSize.
var ErrTooLarge = errors.New("configuration file too large")

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := Read(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Read reads the file at path, refusing one larger than MaxSize before
// reading it (and, should it grow while read, after MaxSize+1 bytes).
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > MaxSize {
		return nil, fmt.Errorf("%s: %w: %d bytes, the limit is %d (16 MiB)", path, ErrTooLarge, fi.Size(), MaxSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s: %w: more than %d bytes (16 MiB)", path, ErrTooLarge, MaxSize)
	}
	return data, nil
}

// Parse validates data; name is used in error messages and may be "".
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, hostAddrs)
}

// parse is Parse, with the addresses of this host (which a wildcard listen
// address covers) given by local: a test names some.
func parse(name string, data []byte, local func() map[netip.Addr]bool) (*Config, error) {
	if e := checkDepth(name, data); e != nil {
		return nil, e
	}
	var tree map[string]any
	md, err := toml.Decode(string(data), &tree)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			line := pe.Position.Line
			if line == 0 { // the decoder gives no line for an error at the very end
				line = 1 + bytes.Count(data[:min(max(pe.Position.Start, 0), len(data))], []byte("\n"))
				if pe.Position.Start == 0 {
					line = 1 + bytes.Count(data, []byte("\n"))
				}
			}
			return nil, &Error{File: name, Line: line, Msg: pe.Message}
		}
		return nil, &Error{File: name, Line: 1 + bytes.Count(data, []byte("\n")), Msg: err.Error()}
	}
	w := &walker{file: name, order: map[string]int{}, localAddrs: local}
	for i, k := range md.Keys() {
		if len(k) == 2 && k[0] == "services" {
			w.order[k[1]] = i
		}
	}
	cfg := w.config(w.table("", tree))
	cfg.File = name
	cfg.Digest = sha256.Sum256(data)
	sourceLines(cfg, data)
	if len(w.ignored) > 0 {
		w.locate(data, w.ignored)
		for _, e := range w.ignored {
			cfg.ignored = append(cfg.ignored, e.Error())
		}
	}
	if len(w.errs) > 0 {
		w.locate(data, w.errs)
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

// hostHeaderName reports whether h is a DNS name or an IP literal as a Host
// header carries it, without the port ([::1] for IPv6).
func hostHeaderName(h string) bool {
	if a, ok := strings.CutPrefix(h, "["); ok {
		ip, err := netip.ParseAddr(strings.TrimSuffix(a, "]"))
		return err == nil && ip.Is6() && strings.HasSuffix(a, "]")
	}
	return validHostname(h)
}

func (w *walker) config(root *table) *Config {
	cfg := &Config{}
	lt := root.sub("log")
	cfg.Log = Log{
		Level:  lt.oneOf("level", "info", "debug", "info", "warn", "error"),
		Format: enum(lt, "format", LogAuto, []LogFormat{LogAuto, LogJSON, LogConsole}),
		Access: lt.boolean("access", true),
	}
	lt.done()

	rt := root.sub("reload")
	cfg.Reload = Reload{
		Debounce: rt.duration("debounce", 200*time.Millisecond, 10*time.Millisecond),
		Recheck:  rt.duration("recheck", 30*time.Second, 0),

		ResolveInterval: rt.duration("resolve_interval", 30*time.Second, 0),
	}
	if cfg.Reload.Debounce > 10*time.Second {
		w.errorf(rt.key("debounce"), "must be at most 10s, have %s", cfg.Reload.Debounce)
	}
	if r := cfg.Reload.Recheck; r > 0 && r < time.Second {
		w.errorf(rt.key("recheck"), "must be 0 (off) or at least 1s, have %s", r)
	}
	if r := cfg.Reload.ResolveInterval; r > 0 && r < time.Second {
		w.errorf(rt.key("resolve_interval"), "must be 0 (off) or at least 1s, have %s", r)
	}
	rt.done()

	at := root.sub("admin")
	if a := at.str("listen", ""); a != "" {
		ap, err := parseListen(a)
		if err != nil {
			w.errorf(at.key("listen"), "%v", err)
		} else {
			cfg.Admin.Listen = ap
		}
	}
	cfg.Admin.AllowRemote = at.boolean("allow_remote", false)
	hosts, _ := at.strs("hosts")
	for i, h := range hosts {
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if !hostHeaderName(h) {
			w.errorf(fmt.Sprintf("%s[%d]", at.key("hosts"), i), "%q is not a host name (no port, no scheme), such as \"lb1.example.net\"", hosts[i])
			continue
		}
		cfg.Admin.Hosts = append(cfg.Admin.Hosts, h)
	}
	if f := at.str("state_file", ""); f != "" && !filepath.IsAbs(f) {
		w.errorf(at.key("state_file"), "%q is not an absolute path, such as \"/var/lib/fulcrum/state.json\"", f)
	} else {
		cfg.Admin.StateFile = f
	}
	cfg.Admin.StateDamaged = enum(at, "state_damaged", StateDamageRefuse, StateDamaged)
	if l := cfg.Admin.Listen; l.IsValid() && !l.Addr().IsLoopback() && !cfg.Admin.AllowRemote {
		w.errorf(at.key("listen"), "%s is not a loopback address: status and metrics would be open to the network; set allow_remote = true to mean it", l)
	}
	at.done()

	ct := root.sub("cluster")
	cfg.Cluster.Freebind = ct.boolean("freebind", false)
	ct.done()

	pt := root.sub("process")
	cfg.Process.Loops = int(pt.integer("loops", 0, 0, MaxLoops))
	pt.done()

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
	w.claims = map[netip.AddrPort][]claim{}
	for _, name := range names {
		svc := st.sub(name)
		if !serviceName.MatchString(name) {
			w.errorf(svc.path, "service name %q may hold only letters, digits, '_' and '-'", name)
		}
		cfg.Services = append(cfg.Services, w.service(name, svc, defaults, listeners))
		svc.done()
	}
	st.done()
	w.checkRoutes()
	w.selfLoops(cfg.Services, listeners)
	w.fallbacks(cfg.Services)
	w.stateFile(cfg)
	if a := cfg.Admin.Listen; a.IsValid() && a.Port() != 0 { // the admin socket is its own: port 0 never clashes
		for other, owner := range listeners {
			if overlaps(other, a) {
				w.errorf("admin.listen", "%s is also listened on by %s", a, owner)
			}
		}
	}
	root.done()
	return cfg
}

func (w *walker) settings(t *table, base Settings) Settings {
	// copy chose between two designs that the event loops replaced; a
	// file written for them still loads, and is told.
	t.oneOf("copy", "pooled", "pooled", "parked")
	if t.has("copy") {
		w.ignore(t.key("copy"), "is ignored: every connection is copied by the event loops, which replaced both designs; remove it")
	}
	return Settings{
		Scheduler:      sched.Kind(t.oneOf("scheduler", string(base.Scheduler), schedulerNames...)),
		ConnectTimeout: t.duration("connect_timeout", base.ConnectTimeout, time.Millisecond),
		IdleTimeout:    t.duration("idle_timeout", base.IdleTimeout, 0),
		Retries:        int(t.integer("retries", int64(base.Retries), 0, MaxRetries)),
		DrainTimeout:   t.duration("drain_timeout", base.DrainTimeout, 0),
		Choices:        int(t.integer("choices", int64(base.Choices), 1, sched.MaxChoices)),
		HashKey:        t.oneOf("hash_key", base.HashKey, sched.HashKeys...),
		TableSize:      w.tableSize(t, base.TableSize),

		Health:       w.health(t.sub("health"), base.Health),
		MaxFails:     int(t.integer("max_fails", int64(base.MaxFails), 0, 1000)),
		FailTimeout:  t.duration("fail_timeout", base.FailTimeout, time.Millisecond),
		SlowStart:    t.duration("slow_start", base.SlowStart, 0),
		MaxConns:     int(t.integer("max_conns", int64(base.MaxConns), 0, 1<<30)),
		QueueTimeout: t.duration("queue_timeout", base.QueueTimeout, 0),
		OnDown:       enum(t, "on_down", base.OnDown, OnDowns),
		OnUp:         enum(t, "on_up", base.OnUp, OnUps),
		OnRoleChange: enum(t, "on_role_change", base.OnRoleChange, OnRoleChanges),
		SplitBrain:   enum(t, "split_brain", base.SplitBrain, SplitBrains),
		HoldTimeout:  t.duration("hold_timeout", base.HoldTimeout, 0),
		UserTimeout:  t.duration("user_timeout", base.UserTimeout, 0),

		ProxyProtocol:     proxyVersion(t, base.ProxyProtocol),
		AcceptProxy:       w.prefixes(t, "accept_proxy", base.AcceptProxy),
		ProxyTimeout:      t.duration("proxy_timeout", base.ProxyTimeout, time.Millisecond),
		Allow:             w.prefixes(t, "allow", base.Allow),
		Deny:              w.prefixes(t, "deny", base.Deny),
		MaxConnsPerSource: int(t.integer("max_conns_per_source", int64(base.MaxConnsPerSource), 0, 1<<30)),
		AcceptRate:        t.number("accept_rate", base.AcceptRate, 0, 1e9),
		AcceptBurst:       int(t.integer("accept_burst", int64(base.AcceptBurst), 0, 1<<30)),

		KeepAliveIdle:     w.keepAliveDuration(t, "keepalive_idle", base.KeepAliveIdle, 0),
		KeepAliveInterval: w.keepAliveDuration(t, "keepalive_interval", base.KeepAliveInterval, time.Second),
		KeepAliveCount:    int(t.integer("keepalive_count", int64(base.KeepAliveCount), 1, 127)),
		HalfCloseTimeout:  t.duration("half_close_timeout", base.HalfCloseTimeout, 0),
		PrereadTimeout:    t.duration("preread_timeout", base.PrereadTimeout, time.Millisecond),
		Protocol:          enum(t, "protocol", base.Protocol, Protocols),
	}
}

// Protocols are the values of protocol.
var Protocols = []Protocol{ProtocolAuto, ProtocolPostgres, ProtocolTCP}

// maxKeepAlive is the longest keepalive idle time or interval Linux accepts
// (TCP_KEEPIDLE, TCP_KEEPINTVL: 32767 seconds).
const maxKeepAlive = 32767 * time.Second

// keepAliveDuration reads a keepalive time: whole seconds (the socket
// options' unit), at least min, at most maxKeepAlive.
func (w *walker) keepAliveDuration(t *table, k string, def, min time.Duration) time.Duration {
	d := t.duration(k, def, min)
	switch {
	case d%time.Second != 0:
		w.errorf(t.key(k), "must be whole seconds (the kernel's unit), have %s", d)
		return def
	case d > maxKeepAlive:
		w.errorf(t.key(k), "must be at most %s, have %s", maxKeepAlive, d)
		return def
	}
	return d
}

// failback reads a service's failback: "never", "manual" or
// "after:DURATION" (returned as "after" and the duration), only with
// scheduler = "first"; absent, "" (today's behaviour: back to the first
// backend as soon as it is up).
func (w *walker) failback(t *table, scheduler sched.Kind) (Failback, time.Duration) {
	v := t.str("failback", "")
	if v == "" {
		return FailbackNone, 0
	}
	if scheduler != "first" {
		w.errorf(t.key("failback"), `needs scheduler = "first" (the one writer it keeps); have scheduler = %q`, scheduler)
		return FailbackNone, 0
	}
	switch f := Failback(v); f {
	case FailbackNever, FailbackManual:
		return f, 0
	}
	if ds, ok := strings.CutPrefix(v, string(FailbackAfter)+":"); ok {
		d, err := time.ParseDuration(ds)
		if err == nil && d > 0 {
			return FailbackAfter, d
		}
		w.errorf(t.key("failback"), `%q: after: needs a positive duration, such as "after:30s"`, v)
		return FailbackNone, 0
	}
	w.errorf(t.key("failback"), `%q is not one of never, manual, after:DURATION (such as "after:30s")`, v)
	return FailbackNone, 0
}

// OnDowns, OnUps, OnRoleChanges and SplitBrains are the values of
// on_down, on_up, on_role_change and split_brain.
var (
	OnDowns       = []OnDown{OnDownKeep, OnDownClose}
	OnUps         = []OnUp{OnUpKeep, OnUpCloseBackups}
	OnRoleChanges = []OnRoleChange{OnRoleChangeClose, OnRoleChangeKeep}
	SplitBrains   = []SplitBrain{SplitBrainRefuse, SplitBrainFirst, SplitBrainNewest}
)

// ProxyVersions are the values of proxy_protocol, by PROXY version.
var ProxyVersions = []string{"none", "v1", "v2"}

// proxyVersion reads proxy_protocol as the PROXY version it names: 0 for
// "none", 1 or 2.
func proxyVersion(t *table, def int) int {
	return slices.Index(ProxyVersions, t.oneOf("proxy_protocol", ProxyVersions[def], ProxyVersions...))
}

// prefixes reads a list of CIDR prefixes; a bare address is a /32 or /128.
func (w *walker) prefixes(t *table, k string, base []netip.Prefix) []netip.Prefix {
	ss, ok := t.strs(k)
	if !ok {
		return base
	}
	out := []netip.Prefix{}
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				w.errorf(fmt.Sprintf("%s[%d]", t.key(k), i), "%q is not an address or a CIDR prefix such as \"10.0.0.0/8\"", s)
				continue
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p != p.Masked() {
			w.errorf(fmt.Sprintf("%s[%d]", t.key(k), i), "%s has bits set beyond its /%d; did you mean %s?", s, p.Bits(), p.Masked())
			continue
		}
		out = append(out, p)
	}
	return out
}

// health reads a [health] table over base; ht may be empty.
func (w *walker) health(ht *table, base Health) Health {
	h := Health{
		Check:    health.CheckKind(ht.oneOf("check", string(base.Check), checkNames...)),
		Interval: ht.duration("interval", base.Interval, 100*time.Millisecond),
		Timeout:  ht.duration("timeout", base.Timeout, time.Millisecond),
		Rise:     int(ht.integer("rise", int64(base.Rise), 1, 100)),
		Fall:     int(ht.integer("fall", int64(base.Fall), 1, 100)),
		Port:     int(ht.integer("port", int64(base.Port), 0, 65535)),
		Address:  ht.str("address", base.Address),
		Send:     ht.str("send", base.Send),
		Expect:   base.Expect,
		Path:     ht.str("path", base.Path),
		Status:   int(ht.integer("status", int64(base.Status), 100, 599)),
		User:     ht.str("user", base.User),

		Role:         ht.oneOf("role", base.Role, Roles...),
		PasswordFile: ht.str("password_file", base.PasswordFile),
		Database:     ht.str("database", base.Database),
		MaxLag:       ht.duration("max_lag", base.MaxLag, 0),

		PatroniPort: int(ht.integer("patroni_port", int64(base.PatroniPort), 0, 65535)),
		Sentinels:   base.Sentinels,
		MasterName:  ht.str("master_name", base.MasterName),
	}
	if ss, ok := ht.strs("sentinels"); ok {
		h.Sentinels = nil
		for i, s := range ss {
			if _, _, err := endpoint(s); err != nil {
				w.errorf(fmt.Sprintf("%s[%d]", ht.key("sentinels"), i), "%v", err)
				continue
			}
			h.Sentinels = append(h.Sentinels, s)
		}
	}
	if ht.has("password_file") {
		h.PasswordFile = w.passwordFile(ht.key("password_file"), h.PasswordFile)
	}
	h.TLS = w.healthTLS(ht, base.TLS)
	h.SendProxy = ht.boolean("send_proxy", base.SendProxy)
	if h.Timeout > h.Interval && (ht.has("timeout") || ht.has("interval")) {
		w.errorf(ht.key("timeout"), "%s is longer than the interval %s", h.Timeout, h.Interval)
	}
	if src := ht.str("expect", ""); ht.has("expect") {
		re, err := regexp.Compile(src)
		if err != nil {
			w.errorf(ht.key("expect"), "not a regular expression: %v", err)
		}
		h.Expect = re
	}
	if h.Check == health.CheckSendExpect && h.Expect == nil && ht.has("check") {
		w.errorf(ht.key("expect"), `check = "send-expect" needs expect, a regular expression the answer must match`)
	}
	if ht.has("path") && !strings.HasPrefix(h.Path, "/") {
		w.errorf(ht.key("path"), "%q must start with /", h.Path)
	}
	ht.done()
	return h
}

// fallbacks checks that each fallback names another service and that no
// chain of fallbacks comes back to where it started.
func (w *walker) fallbacks(svcs []Service) {
	next := map[string]string{}
	for _, s := range svcs {
		next[s.Name] = s.Fallback
	}
	for _, s := range svcs {
		if s.Fallback == "" {
			continue
		}
		key := "services." + s.Name + ".fallback"
		if _, ok := next[s.Fallback]; !ok {
			w.errorf(key, "no service is called %q", s.Fallback)
			continue
		}
		chain := []string{s.Name}
		for at := s.Fallback; at != ""; at = next[at] {
			chain = append(chain, at)
			if at == s.Name {
				w.errorf(key, "fallbacks form a cycle: %s", strings.Join(chain, " → "))
				break
			}
			if len(chain) > len(svcs) {
				break // a cycle further on, reported from a service on it
			}
		}
	}
}

// passwordFile resolves a password_file path against the config file's
// directory and checks now that it can be read, so that a typo is a
// located error at load rather than a backend down at run time. The
// content is not kept: each probe reads the file, so a rotated password
// needs no reload.
func (w *walker) passwordFile(key, p string) string {
	if p == "" {
		return ""
	}
	if rest, ok := credential(p); ok {
		// systemd's LoadCredential=: the file is in $CREDENTIALS_DIRECTORY,
		// which systemd sets for the service's processes only.
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			w.errorf(key, "%s names $CREDENTIALS_DIRECTORY, which is not set: systemd sets it for a unit with LoadCredential= (run the check as the unit does: systemctl start fulcrum, or set it by hand)", p)
			return p
		}
		p = filepath.Join(dir, rest)
	} else if !filepath.IsAbs(p) && w.file != "" {
		p = filepath.Join(filepath.Dir(w.file), p)
	}
	f, err := os.Open(p)
	if err != nil {
		w.errorf(key, "cannot read the password file: %v", err)
		return p
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		w.errorf(key, "%s is not a regular file", p)
	} else if _, err := f.Read(make([]byte, 1)); err != nil {
		w.errorf(key, "cannot read the password file %s: %v", p, err)
	}
	return p
}

// credential reports whether password_file p names a file in systemd's
// credentials directory ("$CREDENTIALS_DIRECTORY/pg.pw" or
// "${CREDENTIALS_DIRECTORY}/pg.pw") and, if so, the name in it.
func credential(p string) (string, bool) {
	for _, pre := range []string{"$CREDENTIALS_DIRECTORY/", "${CREDENTIALS_DIRECTORY}/"} {
		if rest, ok := strings.CutPrefix(p, pre); ok && rest != "" {
			return rest, true
		}
	}
	return "", false
}

// healthTLS reads the tls keys of a [health] table over base, resolves the
// files against the config file's directory and, when this table sets any
// of them, loads them now, so that a missing file or a key that does not
// match its certificate is a located error at load.
func (w *walker) healthTLS(ht *table, base health.TLS) health.TLS {
	t := health.TLS{
		On:         ht.boolean("tls", base.On),
		CA:         w.relative(ht.str("tls_ca", base.CA)),
		Cert:       w.relative(ht.str("tls_cert", base.Cert)),
		Key:        w.relative(ht.str("tls_key", base.Key)),
		ServerName: ht.str("tls_server_name", base.ServerName),
		SkipVerify: !ht.boolean("tls_verify", !base.SkipVerify),
	}
	for _, k := range []string{"tls", "tls_ca", "tls_cert", "tls_key"} {
		if !ht.has(k) {
			continue
		}
		if t.On {
			if _, err := t.Config("localhost"); err != nil {
				w.errorf(ht.key(k), "%v", err)
			}
		}
		break
	}
	return t
}

// relative resolves a path against the config file's directory.
func (w *walker) relative(p string) string {
	if p != "" && !filepath.IsAbs(p) && w.file != "" {
		p = filepath.Join(filepath.Dir(w.file), p)
	}
	return p
}

// tableSize reads table_size, as sched.CheckTableSize allows.
func (w *walker) tableSize(t *table, def int) int {
	n := int(t.integer("table_size", int64(def), 2, sched.MaxTableSize))
	if err := sched.CheckTableSize(n); err != nil {
		w.errorf(t.key("table_size"), "%v", err)
		return def
	}
	return n
}

func (w *walker) service(name string, t *table, defaults Settings, listeners map[netip.AddrPort]string) Service {
	s := Service{Name: name, Settings: w.settings(t, defaults), Fallback: t.str("fallback", "")}
	s.Failback, s.FailbackAfter = w.failback(t, s.Scheduler)
	s.SNI, s.ALPN = w.routeKeys(t)
	s.Source = w.source(t)

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
		// Port 0 binds a fresh port, so it overlaps nothing; but a listener
		// is known by its address as written, so the same one twice clashes.
		// The very same address may be shared by routed services: that is
		// for checkRoutes to judge.
		for other, owner := range listeners {
			if other != ap && overlaps(other, ap) && ap.Port() != 0 {
				w.errorf(key, "%s is also listened on by %s", a, owner)
			}
		}
		w.claims[ap] = append(w.claims[ap], claim{svc: t.path, listen: key, sni: s.SNI, alpn: s.ALPN, acceptProxy: s.AcceptProxy, proxyTimeout: s.ProxyTimeout})
		if _, dup := listeners[ap]; !dup {
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
			Address:       bt.str("address", ""),
			Weight:        int(bt.integer("weight", 1, 0, MaxWeight)),
			Backup:        bt.boolean("backup", false),
			MaxConns:      int(bt.integer("max_conns", 0, 0, 1<<30)),
			SlowStart:     bt.duration("slow_start", s.SlowStart, 0),
			MaxFails:      int(bt.integer("max_fails", int64(s.MaxFails), 0, 1000)),
			FailTimeout:   bt.duration("fail_timeout", s.FailTimeout, time.Millisecond),
			Health:        w.health(bt.sub("health"), s.Health),
			ProxyProtocol: proxyVersion(bt, s.ProxyProtocol),
			OnDown:        enum(bt, "on_down", s.OnDown, OnDowns),
			OnUp:          enum(bt, "on_up", s.OnUp, OnUps),
			OnRoleChange:  enum(bt, "on_role_change", s.OnRoleChange, OnRoleChanges),
		}
		b.Name = bt.str("name", b.Address)
		bt.done()
		if b.Address == "" {
			w.errorf(bt.key("address"), `missing; want host:port such as "127.0.0.1:5432"`)
		} else if host, ap, err := endpoint(b.Address); err != nil {
			w.errorf(bt.key("address"), "%v", err)
		} else {
			b.Host, b.Addr = host, ap
			b.CheckHost, b.CheckAddr = host, ap
			if b.Health.Port != 0 {
				b.CheckAddr = netip.AddrPortFrom(ap.Addr(), uint16(b.Health.Port))
			}
		}
		if b.Health.Address != "" && b.Health.Check != health.CheckNone {
			if host, ap, err := endpoint(b.Health.Address); err != nil {
				w.errorf(bt.key("health.address"), "%v", err)
			} else {
				b.CheckHost, b.CheckAddr = host, ap
			}
		}
		if b.Health.Check == health.CheckSendExpect && b.Health.Expect == nil {
			w.errorf(bt.key("health.expect"), `check = "send-expect" needs expect, a regular expression the answer must match`)
		}
		if h := b.Health; h.Role != RoleAny && !h.Check.TellsRoles() {
			w.errorf(bt.key("health.role"), `role = %q needs check = "pgsql", "mysql" or "redis", which tell roles apart; have check = %q`, h.Role, h.Check)
		}
		if h := b.Health; h.Role == RoleGalera && h.Check != health.CheckMySQL {
			w.errorf(bt.key("health.role"), `role = "galera" needs check = "mysql"; have check = %q`, h.Check)
		}
		if h := b.Health; h.MaxLag > 0 && (h.Role != RoleReplica || !h.Check.TellsRoles()) {
			w.errorf(bt.key("health.max_lag"), `max_lag needs check = "pgsql", "mysql" or "redis" and role = "replica"`)
		}
		if h := b.Health; !h.TLS.On && (h.TLS != health.TLS{}) {
			w.errorf(bt.key("health.tls"), "tls_ca, tls_cert, tls_key, tls_server_name and tls_verify need tls = true")
		}
		if h := b.Health; h.SendProxy && b.ProxyProtocol == 0 && h.Check != health.CheckNone {
			w.errorf(bt.key("health.send_proxy"), `send_proxy sends the header proxy_protocol names; set proxy_protocol = "v1" or "v2"`)
		}
		if h := b.Health; s.SplitBrain == SplitBrainNewest && h.Role == RolePrimary && h.Check != health.CheckPgSQL {
			// Only PostgreSQL's timelines say which claimant is newer.
			w.errorf(bt.key("health.check"), `split_brain = "newest" needs check = "pgsql" (it compares timelines); have check = %q`, h.Check)
		}
		if h := b.Health; h.PatroniPort != 0 && h.Check != health.CheckPgSQL {
			w.errorf(bt.key("health.patroni_port"), `patroni_port needs check = "pgsql"; have check = %q`, h.Check)
		}
		if h := b.Health; len(h.Sentinels) > 0 && h.Check != health.CheckRedis {
			w.errorf(bt.key("health.sentinels"), `sentinels needs check = "redis"; have check = %q`, h.Check)
		} else if len(h.Sentinels) > 0 && h.MasterName == "" {
			w.errorf(bt.key("health.master_name"), "missing: sentinels needs the name they monitor the master under, e.g. \"mymaster\"")
		} else if h.MasterName != "" && len(h.Sentinels) == 0 {
			w.errorf(bt.key("health.sentinels"), "missing: master_name needs the Sentinels to ask, e.g. [\"10.0.0.1:26379\", \"10.0.0.2:26379\", \"10.0.0.3:26379\"]")
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
	if err := sched.CheckBackends(s.Scheduler, sched.Options{Choices: s.Choices, HashKey: s.HashKey, TableSize: s.TableSize}, len(s.Backends)); err != nil {
		w.errorf(t.key("table_size"), "%v", err)
	}
	return s
}

// selfLoops reports each backend through which connections would come back
// to the same service: an address that is one of fulcrum's own listen
// addresses (directly, or covered by a wildcard listen) of the same service,
// or of a service that leads back to it. Each such connection would be
// accepted again and dialled again until descriptors run out. A chain that
// ends (an outer service in front of an inner one) is fine.
func (w *walker) selfLoops(svcs []Service, listeners map[netip.AddrPort]string) {
	var local map[netip.Addr]bool // the host's addresses, read when a wildcard listen needs them
	// owner returns the key of the listen address b reaches, or "".
	owner := func(b netip.AddrPort) string {
		for l, key := range listeners {
			if l.Port() != b.Port() || l.Port() == 0 {
				continue
			}
			if l.Addr() == b.Addr() {
				return key
			}
			if l.Addr().IsUnspecified() && (l.Addr().Is6() || b.Addr().Is4()) {
				if local == nil {
					local = w.localAddrs()
				}
				if b.Addr().IsLoopback() || local[b.Addr()] {
					return key
				}
			}
		}
		return ""
	}
	type edge struct {
		backend int
		to      string // the service reached
		via     string // its listen key
	}
	edges := map[string][]edge{}
	for _, s := range svcs {
		for i, b := range s.Backends {
			if !b.Addr.IsValid() {
				continue
			}
			if key := owner(b.Addr); key != "" {
				to := strings.TrimPrefix(key, "services.")
				to = to[:strings.IndexByte(to, '.')]
				edges[s.Name] = append(edges[s.Name], edge{i, to, key})
			}
		}
	}
	// reaches reports whether from leads to target through edges.
	reaches := func(from, target string) bool {
		seen := map[string]bool{}
		stack := []string{from}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if n == target {
				return true
			}
			if seen[n] {
				continue
			}
			seen[n] = true
			for _, e := range edges[n] {
				stack = append(stack, e.to)
			}
		}
		return false
	}
	for _, s := range svcs {
		for _, e := range edges[s.Name] {
			if reaches(e.to, s.Name) {
				w.errorf(fmt.Sprintf("services.%s.backends[%d].address", s.Name, e.backend),
					"%s is fulcrum's own listen address (%s), which leads back to this service: each connection would loop through fulcrum until descriptors run out",
					s.Backends[e.backend].Address, e.via)
			}
		}
	}
}

// hostAddrs returns the addresses of this host's interfaces.
func hostAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	as, err := net.InterfaceAddrs()
	if err != nil {
		return out // loopback is still caught; other addresses are not
	}
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out
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

// endpoint parses a backend's host:port. An IP address gives the final
// address; a host name is returned as host, with only the port in ap, for
// the daemon to resolve.
func endpoint(s string) (host string, ap netip.AddrPort, err error) {
	h, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", ap, fmt.Errorf("%q is not host:port", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", ap, fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.IsUnspecified() {
			return "", ap, fmt.Errorf("%q: cannot connect to the unspecified address", s)
		}
		if ip.Zone() != "" {
			return "", ap, fmt.Errorf("%q: an address with a zone is not supported", s)
		}
		return "", netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	if h == "" {
		return "", ap, fmt.Errorf("%q: host is missing", s)
	}
	if !validHostname(h) {
		return "", ap, fmt.Errorf("%q: %q is neither an IP address nor a host name", s, h)
	}
	return h, netip.AddrPortFrom(netip.Addr{}, uint16(p)), nil
}

// validHostname checks the syntax of a DNS name: dot-separated labels of
// letters, digits, '-' and '_', none empty or longer than 63, 253 in all.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Names returns the host names the configuration's backends and checks
// name, each once, in file order.
func (cfg *Config) Names() []string {
	var names []string
	for _, s := range cfg.Services {
		for _, b := range s.Backends {
			for _, h := range []string{b.Host, b.CheckHost} {
				if h != "" && !slices.Contains(names, h) {
					names = append(names, h)
				}
			}
		}
	}
	return names
}
