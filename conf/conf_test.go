package conf

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const sample = `# the issue's example
[log]
level  = "info"
format = "auto"
access = true

[defaults]
scheduler       = "wrr"
connect_timeout = "3s"
idle_timeout    = "0s"
retries         = 2

[services.pg]
listen    = ["127.0.0.1:15432", "[::1]:15432"]
scheduler = "lc"
  [[services.pg.backends]]
  name    = "pg-a"
  address = "127.0.0.1:5432"
  weight  = 3
  [[services.pg.backends]]
  address = "127.0.0.2:5432"

[services.redis]
listen = [":16379"]
connect_timeout = "250ms"
idle_timeout = "1h"
copy = "parked"
backends = [ { name = "r1", address = "127.0.0.1:6379", weight = 0 } ]
`

func TestParseSample(t *testing.T) {
	cfg, err := Parse("sample.toml", []byte(sample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(cfg.Services) != 2 || cfg.Services[0].Name != "pg" || cfg.Services[1].Name != "redis" {
		t.Fatalf("services = %+v; want pg, redis in file order", cfg.Services)
	}
	pg, redis := cfg.Services[0], cfg.Services[1]
	if pg.Scheduler != "lc" || pg.ConnectTimeout != 3*time.Second || pg.Retries != 2 || pg.DrainTimeout != 5*time.Minute {
		t.Errorf("pg settings = %+v; want lc, 3s, 2 retries, 5m drain", pg.Settings)
	}
	wantListen := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:15432"), netip.MustParseAddrPort("[::1]:15432")}
	if len(pg.Listen) != 2 || pg.Listen[0] != wantListen[0] || pg.Listen[1] != wantListen[1] {
		t.Errorf("pg listen = %v; want %v", pg.Listen, wantListen)
	}
	if b := pg.Backends[0]; b.Name != "pg-a" || b.Weight != 3 || b.Addr != netip.MustParseAddrPort("127.0.0.1:5432") {
		t.Errorf("pg backend 0 = %+v", b)
	}
	if b := pg.Backends[1]; b.Name != "127.0.0.2:5432" || b.Weight != 1 {
		t.Errorf("pg backend 1 = %+v; want name defaulting to the address, weight 1", b)
	}
	if w := cfg.Warnings(); len(w) == 0 || !strings.HasPrefix(w[0], "sample.toml:27: services.redis.copy: is ignored") {
		t.Errorf("warnings %q; want redis's copy first, located, as accepted and ignored", w)
	}
	if redis.Scheduler != "wrr" || redis.ConnectTimeout != 250*time.Millisecond || redis.IdleTimeout != time.Hour {
		t.Errorf("redis settings = %+v; want wrr from defaults, own timeouts", redis.Settings)
	}
	if l := redis.Listen[0]; !l.Addr().IsUnspecified() || l.Port() != 16379 {
		t.Errorf("redis listen = %v; want every address, port 16379", l)
	}
	if redis.Backends[0].Weight != 0 {
		t.Errorf("redis weight = %d; want 0", redis.Backends[0].Weight)
	}
	if !cfg.Log.Access || cfg.Log.Level != "info" {
		t.Errorf("log = %+v", cfg.Log)
	}
	if cfg.Cluster.Freebind {
		t.Errorf("cluster.freebind = true; want false by default")
	}
	on, err := Parse("f.toml", []byte("[cluster]\nfreebind = true\n"+sample))
	if err != nil || !on.Cluster.Freebind {
		t.Errorf("[cluster] freebind = true: %+v, %v", on, err)
	}
}

// TestHealthInheritance: [defaults.health] → [services.x.health] → a
// backend's health, field by field; the check address follows port and
// address overrides.
func TestHealthInheritance(t *testing.T) {
	cfg, err := Parse("f.toml", []byte(`
[defaults]
max_fails = 5
[defaults.health]
check = "tcp"
interval = "5s"
[services.pg]
listen = ["127.0.0.1:1"]
slow_start = "30s"
max_conns = 100
queue_timeout = "2s"
[services.pg.health]
check = "http"
port = 8008
path = "/primary"
  [[services.pg.backends]]
  name = "a"
  address = "127.0.0.1:5432"
  max_conns = 20
  [[services.pg.backends]]
  name = "b"
  address = "127.0.0.2:5432"
  backup = true
  slow_start = "0s"
  fail_timeout = "1s"
  health = { path = "/replica", port = 8009 }
`))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Services[0]
	if s.MaxFails != 5 || s.SlowStart != 30*time.Second || s.MaxConns != 100 || s.QueueTimeout != 2*time.Second {
		t.Errorf("service settings = %+v", s.Settings)
	}
	a, b := s.Backends[0], s.Backends[1]
	if a.Health.Check != "http" || a.Health.Interval != 5*time.Second || a.Health.Path != "/primary" || a.CheckAddr != netip.MustParseAddrPort("127.0.0.1:8008") {
		t.Errorf("backend a health = %+v at %v", a.Health, a.CheckAddr)
	}
	if a.MaxConns != 20 || a.Backup || a.SlowStart != 30*time.Second || a.MaxFails != 5 {
		t.Errorf("backend a = %+v", a)
	}
	if b.Health.Path != "/replica" || b.CheckAddr != netip.MustParseAddrPort("127.0.0.2:8009") || !b.Backup || b.SlowStart != 0 || b.FailTimeout != time.Second {
		t.Errorf("backend b = %+v at %v", b, b.CheckAddr)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse("", []byte(`
[services.s]
listen = ["127.0.0.1:1"]
backends = [{address = "127.0.0.1:2"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Scheduler: "wrr", ConnectTimeout: 3 * time.Second, Retries: 2, DrainTimeout: 5 * time.Minute,
		Choices: 2, HashKey: "ip", TableSize: 65537, MaxFails: 3, FailTimeout: 10 * time.Second,
		ProxyTimeout: 3 * time.Second, OnDown: "keep", OnUp: "keep", OnRoleChange: "close", SplitBrain: "refuse",
		KeepAliveIdle: time.Minute, KeepAliveInterval: 15 * time.Second, KeepAliveCount: 4, HalfCloseTimeout: 2 * time.Minute, PrereadTimeout: 5 * time.Second, Protocol: "auto",
		Health: Health{Check: "none", Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3, Path: "/", Status: 200, User: "fulcrum", Role: "any"}}
	if got := cfg.Services[0].Settings; !reflect.DeepEqual(got, want) {
		t.Errorf("settings = %+v; want %+v", got, want)
	}
	if cfg.Log != (Log{Level: "info", Format: "auto", Access: true}) {
		t.Errorf("log = %+v", cfg.Log)
	}
}

// TestErrors checks that each problem is reported with its file, line and
// key, and that one file with many problems reports them all.
func TestErrors(t *testing.T) {
	base := "[services.s]\nlisten = [\"127.0.0.1:1\"]\n"
	ok := base + "backends = [{address = \"127.0.0.1:2\"}]\n"
	tests := []struct {
		name string
		src  string
		want []string // each must appear, in this order
	}{
		{"syntax", "[services.s\nlisten = 1\n", []string{"f.toml:2: expected '.' or ']' to end table name"}},
		{"unknown top-level key", ok + "[servces.t]\n", []string{"f.toml:4: servces: unknown key (did you mean \"services\"?)"}},
		{"unknown service key", ok + "wieght = 3\n", []string{"f.toml:4: services.s.wieght: unknown key"}},
		{"unknown backend key", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\nwieght = 3\n",
			[]string{"f.toml:5: services.s.backends[0].wieght: unknown key (did you mean \"weight\"?)"}},
		{"unknown log key", "[log]\nlevl = \"info\"\n" + ok, []string{"f.toml:2: log.levl: unknown key"}},
		{"bad level", "[log]\nlevel = \"loud\"\n" + ok, []string{`f.toml:2: log.level: "loud" is not one of debug, info, warn, error`}},
		{"bad listen", "[services.s]\nlisten = [\"localhost:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:2: services.s.listen[0]: "localhost:1": listen on an IP address`}},
		{"no listen", "[services.s]\nbackends = [{address = \"127.0.0.1:2\"}]\n", []string{"f.toml:1: services.s.listen: at least one listen address"}},
		{"bad backend address", base + "[[services.s.backends]]\naddress = \"127.0.0.1\"\n",
			[]string{`f.toml:4: services.s.backends[0].address: "127.0.0.1" is not host:port`}},
		{"port zero", base + "[[services.s.backends]]\naddress = \"127.0.0.1:0\"\n",
			[]string{`f.toml:4: services.s.backends[0].address: "127.0.0.1:0": port "0" is not a number from 1 to 65535`}},
		{"missing address", base + "[[services.s.backends]]\nname = \"a\"\n",
			[]string{`f.toml:3: services.s.backends[0].address: missing`}},
		{"negative weight", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\nweight = -1\n",
			[]string{"f.toml:5: services.s.backends[0].weight: must not be negative, have -1"}},
		{"huge weight", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\nweight = 70000\n",
			[]string{"f.toml:5: services.s.backends[0].weight: must be between 0 and 65535"}},
		{"weight as string", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\nweight = \"3\"\n",
			[]string{`f.toml:5: services.s.backends[0].weight: want an integer, have string "3"`}},
		{"unknown scheduler", ok + "scheduler = \"wlcx\"\n", []string{`f.toml:4: services.s.scheduler: "wlcx" is not one of`}},
		{"bad duration", "[defaults]\nconnect_timeout = \"3\"\n" + ok, []string{`f.toml:2: defaults.connect_timeout: "3" is not a duration`}},
		{"zero connect timeout", "[defaults]\nconnect_timeout = \"0s\"\n" + ok, []string{`f.toml:2: defaults.connect_timeout: must be at least 1ms`}},
		{"negative idle", ok + "idle_timeout = \"-1s\"\n", []string{`f.toml:4: services.s.idle_timeout: must not be negative`}},
		{"unknown copy", "[defaults]\ncopy = \"epoll\"\n" + ok, []string{`f.toml:2: defaults.copy: "epoll" is not one of`}},
		{"too many retries", ok + "retries = 99\n", []string{`f.toml:4: services.s.retries: must be between 0 and 15, have 99`}},
		{"zero choices", ok + "choices = 0\n", []string{`f.toml:4: services.s.choices: must be between 1 and 16, have 0`}},
		{"bad hash key", "[defaults]\nhash_key = \"port\"\n" + ok, []string{`f.toml:2: defaults.hash_key: "port" is not one of ip, ip_port`}},
		{"table size not prime", ok + "table_size = 65536\n", []string{`f.toml:4: services.s.table_size: 65536 is not a prime`}},
		{"table size too small for mh", base + "scheduler = \"mh\"\ntable_size = 3\n" +
			"backends = [{address = \"127.0.0.1:2\"}, {address = \"127.0.0.1:3\"}, {address = \"127.0.0.1:4\"}]\n",
			[]string{`f.toml:4: services.s.table_size: 3 must be larger than the number of backends (3)`}},
		{"table size too large", ok + "table_size = 99999999999\n", []string{`f.toml:4: services.s.table_size: must be between 2 and 16777213`}},
		{"no backends", base, []string{"f.toml:1: services.s.backends: a service needs at least one backend"}},
		{"duplicate backend name", base + "[[services.s.backends]]\nname = \"a\"\naddress = \"127.0.0.1:2\"\n[[services.s.backends]]\nname = \"a\"\naddress = \"127.0.0.1:3\"\n",
			[]string{`f.toml:7: services.s.backends[1].name: backend name "a" is already used by services.s.backends[0]`}},
		{"duplicate default name", base + "backends = [{address = \"127.0.0.1:2\"}, {address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:3: services.s.backends[1].name: backend name "127.0.0.1:2" is already used`}},
		{"duplicate listen across services", ok + "[services.t]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:5: services.t.listen[0]: 127.0.0.1:1 is also listened on by services.s.listen[0]`}},
		{"the same port-0 address twice", "[services.s]\nlisten = [\"[::1]:0\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n[services.t]\nlisten = [\"[::1]:0\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:5: services.t.listen[0]: [::1]:0 is also listened on by services.s.listen[0]`}},
		{"wildcard overlaps", ok + "[services.t]\nlisten = [\":1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:5: services.t.listen[0]: :1 is also listened on by services.s.listen[0]`}},
		{"bad service name", "[services.\"a b\"]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:1: services.a b: service name "a b" may hold only`}},
		{"unknown check", ok + "[services.s.health]\ncheck = \"ping\"\n", []string{`f.toml:5: services.s.health.check: "ping" is not one of none, tcp, send-expect`}},
		{"check timeout over interval", ok + "[services.s.health]\ncheck = \"tcp\"\ninterval = \"1s\"\ntimeout = \"2s\"\n", []string{`f.toml:7: services.s.health.timeout: 2s is longer than the interval 1s`}},
		{"send-expect without expect", ok + "[services.s.health]\ncheck = \"send-expect\"\n", []string{`services.s.health.expect: check = "send-expect" needs expect`}},
		{"bad expect", ok + "[services.s.health]\ncheck = \"send-expect\"\nexpect = \"(\"\n", []string{`f.toml:6: services.s.health.expect: not a regular expression`}},
		{"bad backend health", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\nhealth = { port = 70000, chek = \"tcp\" }\n",
			[]string{`f.toml:5: services.s.backends[0].health.port: must be between 0 and 65535`, `f.toml:5: services.s.backends[0].health.chek: unknown key`}},
		{"bad cidr", ok + "allow = [\"10.0.0.0/8\", \"10.1.2.3/8\", \"nope\"]\n", []string{`f.toml:4: services.s.allow[1]: 10.1.2.3/8 has bits set beyond its /8; did you mean 10.0.0.0/8?`, `services.s.allow[2]: "nope" is not an address or a CIDR prefix`}},
		{"bad proxy protocol", ok + "proxy_protocol = \"v3\"\n", []string{`f.toml:4: services.s.proxy_protocol: "v3" is not one of none, v1, v2`}},
		{"negative rate", ok + "accept_rate = -1\n", []string{`f.toml:4: services.s.accept_rate: must be between 0 and 1e+09, have -1`}},
		{"remote admin", "[admin]\nlisten = \"0.0.0.0:9900\"\n" + ok, []string{"f.toml:2: admin.listen: 0.0.0.0:9900 is not a loopback address"}},
		{"admin clashes", "[admin]\nlisten = \"127.0.0.1:1\"\n" + ok, []string{"f.toml:2: admin.listen: 127.0.0.1:1 is also listened on by services.s.listen[0]"}},
		{"role without a role check", ok + "[services.s.health]\ncheck = \"tcp\"\nrole = \"primary\"\n",
			[]string{`services.s.backends[0].health.role: role = "primary" needs check = "pgsql", "mysql" or "redis"`}},
		{"bad role", ok + "[services.s.health]\ncheck = \"pgsql\"\nrole = \"leader\"\n", []string{`f.toml:6: services.s.health.role: "leader" is not one of any, primary, replica`}},
		{"missing password file", ok + "[services.s.health]\ncheck = \"pgsql\"\npassword_file = \"/nonexistent/pw\"\n",
			[]string{`f.toml:6: services.s.health.password_file: cannot read the password file: open /nonexistent/pw: no such file or directory`}},
		{"password file is a directory", ok + "[services.s.health]\ncheck = \"pgsql\"\npassword_file = \"/\"\n",
			[]string{`f.toml:6: services.s.health.password_file: / is not a regular file`}},
		{"max_lag on a primary", ok + "[services.s.health]\ncheck = \"pgsql\"\nrole = \"primary\"\nmax_lag = \"10s\"\n",
			[]string{`services.s.backends[0].health.max_lag: max_lag needs check = "pgsql", "mysql" or "redis" and role = "replica"`}},
		{"patroni_port without pgsql", ok + "[services.s.health]\ncheck = \"http\"\npatroni_port = 8008\n",
			[]string{`services.s.backends[0].health.patroni_port: patroni_port needs check = "pgsql"; have check = "http"`}},
		{"sentinels without master_name", ok + "[services.s.health]\ncheck = \"redis\"\nsentinels = [\"127.0.0.1:26379\", \"nope\"]\n",
			[]string{`services.s.backends[0].health.master_name: missing: sentinels needs the name`, `f.toml:6: services.s.health.sentinels[1]: "nope" is not host:port`}},
		{"sentinels without redis", ok + "[services.s.health]\ncheck = \"pgsql\"\nsentinels = [\"127.0.0.1:26379\"]\nmaster_name = \"m\"\n",
			[]string{`services.s.backends[0].health.sentinels: sentinels needs check = "redis"; have check = "pgsql"`}},
		{"master_name without sentinels", ok + "[services.s.health]\ncheck = \"redis\"\nmaster_name = \"m\"\n",
			[]string{`services.s.backends[0].health.sentinels: missing: master_name needs the Sentinels to ask`}},
		{"bad on_down", ok + "on_down = \"shutdown\"\n", []string{`f.toml:4: services.s.on_down: "shutdown" is not one of keep, close`}},
		{"bad backend on_up", base + "[[services.s.backends]]\naddress = \"127.0.0.1:2\"\non_up = \"close\"\n",
			[]string{`f.toml:5: services.s.backends[0].on_up: "close" is not one of keep, close-backups`}},
		{"unknown fallback", ok + "fallback = \"rw\"\n", []string{`f.toml:4: services.s.fallback: no service is called "rw"`}},
		{"fallback cycle", "[services.a]\nlisten = [\"127.0.0.1:1\"]\nfallback = \"b\"\nbackends = [{address = \"127.0.0.1:2\"}]\n" +
			"[services.b]\nlisten = [\"127.0.0.1:3\"]\nfallback = \"a\"\nbackends = [{address = \"127.0.0.1:2\"}]\n",
			[]string{`f.toml:3: services.a.fallback: fallbacks form a cycle: a → b → a`, `f.toml:7: services.b.fallback: fallbacks form a cycle: b → a → b`}},
		{"fallback to itself", ok + "fallback = \"s\"\n", []string{`f.toml:4: services.s.fallback: fallbacks form a cycle: s → s`}},
		{"fallback in defaults", "[defaults]\nfallback = \"s\"\n" + ok, []string{`f.toml:2: defaults.fallback: unknown key`}},
		{"bad split_brain", ok + "split_brain = \"both\"\n", []string{`f.toml:4: services.s.split_brain: "both" is not one of refuse, first, newest`}},
		{"negative hold", ok + "hold_timeout = \"-1s\"\n", []string{`f.toml:4: services.s.hold_timeout: must not be negative`}},
		{"cluster typo", "[cluster]\nfreebnd = true\n" + ok, []string{`f.toml:2: cluster.freebnd: unknown key`}},
		{"cluster freebind type", "[cluster]\nfreebind = \"yes\"\n" + ok, []string{`f.toml:2: cluster.freebind: want true or false`}},
		{"everything at once", `[log]
level = "loud"
[defaults]
retries = -1
[services.s]
listen = ["127.0.0.1:1", "127.0.0.1:1"]
scheduler = "nope"
  [[services.s.backends]]
  address = "127.0.0.1"
  weight = -2
  color = "red"
`, []string{
			"f.toml:2: log.level",
			"f.toml:4: defaults.retries",
			"f.toml:6: services.s.listen[1]",
			"f.toml:7: services.s.scheduler",
			"f.toml:9: services.s.backends[0].address",
			"f.toml:10: services.s.backends[0].weight",
			"f.toml:11: services.s.backends[0].color: unknown key",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("f.toml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse = %+v, nil; want errors %q", cfg, tt.want)
			}
			msg := err.Error()
			at := 0
			for _, w := range tt.want {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Fatalf("Parse error =\n%s\nwant it to contain, in order:\n%s", msg, strings.Join(tt.want, "\n"))
				}
				at += i + len(w)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "f.toml" || e.Line == 0 {
				t.Errorf("errors.As(*Error) = %+v; want file and line set", e)
			}
		})
	}
}

// TestDatabaseChecks: the role keys reach every backend, a backend may
// override on_down and on_up, and a relative password_file is read from
// the config file's directory.
func TestDatabaseChecks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pg.pw"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "fulcrum.toml"), []byte(`
[defaults]
user_timeout = "30s"
[services.ro]
listen = ["127.0.0.1:4"]
fallback = "rw"
hold_timeout = "10s"
backends = [{address = "127.0.0.1:5"}]
[services.rw]
listen = ["127.0.0.1:1"]
scheduler = "first"
split_brain = "first"
on_down = "close"
on_up = "close-backups"
[services.rw.health]
check = "pgsql"
role = "replica"
user = "checker"
database = "app"
password_file = "pg.pw"
max_lag = "10s"
[[services.rw.backends]]
address = "127.0.0.1:2"
[[services.rw.backends]]
address = "127.0.0.1:3"
on_down = "keep"
on_role_change = "keep"
health = { role = "primary", max_lag = "0s" }
`))
	if err != nil {
		t.Fatal(err)
	}
	ro, s := cfg.Services[0], cfg.Services[1]
	if ro.Fallback != "rw" || ro.HoldTimeout != 10*time.Second || ro.UserTimeout != 30*time.Second || ro.SplitBrain != "refuse" {
		t.Errorf("ro = fallback %q, hold %v, user_timeout %v, split_brain %q", ro.Fallback, ro.HoldTimeout, ro.UserTimeout, ro.SplitBrain)
	}
	if s.Scheduler != "first" || s.OnDown != "close" || s.OnUp != "close-backups" || s.SplitBrain != "first" || s.Fallback != "" {
		t.Errorf("service = %s, %s, %s, %s", s.Scheduler, s.OnDown, s.OnUp, s.SplitBrain)
	}
	h := s.Backends[0].Health
	want := Health{Check: "pgsql", Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3, Path: "/", Status: 200,
		User: "checker", Role: "replica", PasswordFile: filepath.Join(dir, "pg.pw"), Database: "app", MaxLag: 10 * time.Second}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("health = %+v; want %+v", h, want)
	}
	if b := s.Backends[1]; b.OnDown != "keep" || b.OnUp != "close-backups" || b.OnRoleChange != "keep" || b.Health.Role != "primary" || b.Health.PasswordFile != want.PasswordFile {
		t.Errorf("backend 1 = %+v", b)
	}
	if b := s.Backends[0]; b.OnRoleChange != "close" {
		t.Errorf("backend 0 on_role_change = %q; want the default close", b.OnRoleChange)
	}
}

// TestSplitBrainNewest: split_brain = "newest" compares PostgreSQL
// timelines, so it needs the pgsql check on a primary service.
func TestSplitBrainNewest(t *testing.T) {
	const head = "[services.rw]\nlisten = [\"127.0.0.1:1\"]\nsplit_brain = \"newest\"\nbackends = [{address = \"127.0.0.1:2\"}]\n"
	cfg, err := Parse("f.toml", []byte(head+"health = { check = \"pgsql\", role = \"primary\" }\n"))
	if err != nil || cfg.Services[0].SplitBrain != "newest" {
		t.Fatalf("Parse = %v; want split_brain newest", err)
	}
	_, err = Parse("f.toml", []byte(head+"health = { check = \"redis\", role = \"primary\" }\n"))
	if err == nil || !strings.Contains(err.Error(), `split_brain = "newest" needs check = "pgsql"`) {
		t.Errorf("newest over redis: %v; want an error", err)
	}
}

// TestEmpty: an empty or truncated-to-nothing file is refused, so that a
// file caught mid-write never closes every listener.
func TestEmpty(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "[log]\nlevel = \"info\"\n"} {
		if cfg, err := Parse("f.toml", []byte(src)); err == nil || !strings.Contains(err.Error(), "f.toml: services: no services") {
			t.Errorf("Parse(%q) = %v, %v; want a no-services error", src, cfg, err)
		}
	}
}

// TestHostnameKept: conf does no DNS; a host name is kept for the daemon
// to resolve, and a malformed one is refused.
func TestHostnameKept(t *testing.T) {
	cfg, err := Parse("f.toml", []byte("[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"db.internal:5432\", health = {check = \"tcp\", address = \"patroni.internal:8008\"}}, {address = \"127.0.0.2:5432\"}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Services[0].Backends[0]
	if b.Host != "db.internal" || b.Addr.Port() != 5432 || b.Addr.Addr().IsValid() || b.CheckHost != "patroni.internal" || b.CheckAddr.Port() != 8008 {
		t.Errorf("backend = host %q addr %v, check %q %v; want db.internal with port 5432, patroni.internal with 8008", b.Host, b.Addr, b.CheckHost, b.CheckAddr)
	}
	if got := cfg.Names(); !slices.Equal(got, []string{"db.internal", "patroni.internal"}) {
		t.Errorf("Names() = %v", got)
	}
	_, err = Parse("f.toml", []byte("[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"no pe!:5432\"}]\n"))
	if err == nil || !strings.Contains(err.Error(), `f.toml:3: services.s.backends[0].address: "no pe!:5432": "no pe!" is neither an IP address nor a host name`) {
		t.Errorf("Parse = %v; want a located syntax error", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "fulcrum.toml")
	if err := os.WriteFile(p, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(p)
	if err != nil || cfg.File != p {
		t.Fatalf("Load = %v, %v", cfg, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v; want ErrNotExist", err)
	}
	if err := os.WriteFile(p, []byte("[services.s]\nlisten = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p+":2: services.s.listen: want an array of strings") {
		t.Errorf("Load = %v; want %s:2: services.s.listen: …", err, p)
	}
}

func TestLocate(t *testing.T) {
	src := `a = 1 # [not.a.table]
"quoted.key" = "x = [y]"
[t]
s = """
multi
line = 2
"""
arr = [
  1,
  { k = "v" },
]
[[t.list]]
x = 1
[[t.list]]
x = 2
  [[t.list.sub]]
  y = 3
[t . "u v"]
dotted.key = 4
`
	want := map[string]int{
		"a": 1, "quoted.key": 2, "t": 3, "t.s": 4, "t.arr": 8, "t.arr[1].k": 10,
		"t.list[0]": 12, "t.list[0].x": 13, "t.list[1]": 14, "t.list[1].x": 15,
		"t.list[1].sub[0].y": 17, "t.u v.dotted.key": 19,
	}
	got := locate(src)
	for k, line := range want {
		if got[k] != line {
			t.Errorf("locate[%q] = %d; want %d", k, got[k], line)
		}
	}
	if _, ok := got["line"]; ok {
		t.Errorf("locate read a key inside a multi-line string")
	}
}
