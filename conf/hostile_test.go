package conf

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTooLarge: a file above MaxSize is refused with a clear error, without
// reading (or parsing) all of it.
func TestTooLarge(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big.toml")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: 50 MB that cost no disk, and that a reader would take long to parse.
	if err := f.Truncate(50 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	start := time.Now()
	_, err = Load(p)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "52428800 bytes, the limit is 16777216") {
		t.Fatalf("Load(50 MB) = %v; want ErrTooLarge naming the size and the limit", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusing took %v; want it decided before reading", d)
	}
	if err := os.Truncate(p, MaxSize); err != nil { // at the limit: read (and refused as TOML, not for its size)
		t.Fatal(err)
	}
	if data, err := Read(p); err != nil || len(data) != MaxSize {
		t.Errorf("Read(MaxSize bytes) = %d bytes, %v; want all of it", len(data), err)
	}
}

// TestSelfLoop: a backend that is one of fulcrum's own listen addresses
// (directly, or covered by a wildcard listen) is a located error.
func TestSelfLoop(t *testing.T) {
	local := func() map[netip.Addr]bool { return map[netip.Addr]bool{netip.MustParseAddr("192.0.2.7"): true} }
	tests := []struct {
		name, src, want string // want "" means valid
	}{
		{"own address", "[services.s]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.1:7001\"}]\n",
			"f.toml:3: services.s.backends[0].address: 127.0.0.1:7001 is fulcrum's own listen address (services.s.listen[0])"},
		{"through another service", "[services.s]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.1:7002\"}]\n" +
			"[services.t]\nlisten = [\"127.0.0.1:7002\"]\nbackends = [{address = \"127.0.0.1:7001\"}]\n",
			"f.toml:3: services.s.backends[0].address: 127.0.0.1:7002 is fulcrum's own listen address (services.t.listen[0])"},
		{"a chain that ends", "[services.outer]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.1:7002\"}]\n" +
			"[services.inner]\nlisten = [\"127.0.0.1:7002\"]\nbackends = [{address = \"127.0.0.1:7003\"}]\n", ""},
		{"wildcard covers loopback", "[services.s]\nlisten = [\":7001\"]\nbackends = [{address = \"127.0.0.5:7001\"}]\n",
			"services.s.backends[0].address: 127.0.0.5:7001 is fulcrum's own"},
		{"wildcard covers a local address", "[services.s]\nlisten = [\"0.0.0.0:7001\"]\nbackends = [{address = \"192.0.2.7:7001\"}]\n",
			"services.s.backends[0].address: 192.0.2.7:7001 is fulcrum's own"},
		{"wildcard, remote backend", "[services.s]\nlisten = [\":7001\"]\nbackends = [{address = \"192.0.2.8:7001\"}]\n", ""},
		{"other loopback address", "[services.s]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.2:7001\"}]\n", ""},
		{"IPv4 wildcard, IPv6 backend", "[services.s]\nlisten = [\"0.0.0.0:7001\"]\nbackends = [{address = \"[::1]:7001\"}]\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("f.toml", []byte(tt.src), local)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Parse = %v; want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Parse = %v; want %q", err, tt.want)
			}
		})
	}
}

// TestKeepAliveAndHalfClose: the keepalive keys and half_close_timeout, from
// [defaults] and per service.
func TestKeepAliveAndHalfClose(t *testing.T) {
	cfg, err := Parse("f.toml", []byte(`[defaults]
keepalive_idle = "2m"
keepalive_interval = "20s"
keepalive_count = 3
half_close_timeout = "30s"
[services.s]
listen = ["127.0.0.1:1"]
backends = [{address = "127.0.0.1:2"}]
[services.off]
listen = ["127.0.0.1:3"]
keepalive_idle = "0s"
half_close_timeout = "0s"
backends = [{address = "127.0.0.1:2"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s, off := cfg.Services[0], cfg.Services[1]
	if s.KeepAliveIdle != 2*time.Minute || s.KeepAliveInterval != 20*time.Second || s.KeepAliveCount != 3 || s.HalfCloseTimeout != 30*time.Second {
		t.Errorf("s = %v %v %d %v; want 2m 20s 3 30s from [defaults]", s.KeepAliveIdle, s.KeepAliveInterval, s.KeepAliveCount, s.HalfCloseTimeout)
	}
	if off.KeepAliveIdle != 0 || off.HalfCloseTimeout != 0 {
		t.Errorf("off = %v, %v; want both 0 (off)", off.KeepAliveIdle, off.HalfCloseTimeout)
	}
	ok := "[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n"
	for _, c := range []struct{ src, want string }{
		{ok + "keepalive_idle = \"1500ms\"\n", "f.toml:4: services.s.keepalive_idle: must be whole seconds"},
		{ok + "keepalive_interval = \"0s\"\n", "f.toml:4: services.s.keepalive_interval: must be at least 1s"},
		{ok + "keepalive_idle = \"10h\"\n", "f.toml:4: services.s.keepalive_idle: must be at most 9h6m7s"},
		{ok + "keepalive_count = 0\n", "f.toml:4: services.s.keepalive_count: must be between 1 and 127"},
		{ok + "half_close_timeout = \"-1s\"\n", "f.toml:4: services.s.half_close_timeout: must not be negative"},
	} {
		if _, err := Parse("f.toml", []byte(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v; want %q", c.src, err, c.want)
		}
	}
}

// TestAdminHosts: [admin] hosts are host names, kept lower case.
func TestAdminHosts(t *testing.T) {
	ok := "[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n"
	cfg, err := Parse("f.toml", []byte("[admin]\nlisten = \"127.0.0.1:9\"\nhosts = [\"LB1.example.net.\", \"lb1\", \"10.0.0.1\", \"[::1]\"]\n"+ok))
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.Admin.Hosts; len(h) != 4 || h[0] != "lb1.example.net" || h[1] != "lb1" || h[2] != "10.0.0.1" || h[3] != "[::1]" {
		t.Errorf("hosts = %q; want lb1.example.net, lb1, 10.0.0.1, [::1]", h)
	}
	for _, bad := range []string{"lb1:9000", "http://lb1", "", "a b", "[::1", "[10.0.0.1]", "-lb1"} {
		src := "[admin]\nhosts = [\"" + bad + "\"]\n" + ok
		if _, err := Parse("f.toml", []byte(src)); err == nil || !strings.Contains(err.Error(), "f.toml:2: admin.hosts[0]: ") {
			t.Errorf("hosts = [%q]: %v; want a located error", bad, err)
		}
	}
}
