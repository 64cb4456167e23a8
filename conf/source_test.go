package conf

import (
	"strings"
	"testing"
)

// TestSource: source takes "client", located for the daemon's self-test;
// an array of egress addresses is validated, then refused as not yet
// supported; anything else is a located error.
func TestSource(t *testing.T) {
	const head = "[services.pg]\nlisten = [\"127.0.0.1:15432\"]\nbackends = [{ address = \"10.0.0.1:5432\" }]\n"
	cfg, err := Parse("f.toml", []byte(head+"source = \"client\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Services[0].Source; !s.Client || s.Line != 4 || s.Addrs != nil {
		t.Errorf("source = %+v; want client at line 4", s)
	}
	cfg, err = Parse("f.toml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Services[0].Source; s.Client || s.Line != 0 {
		t.Errorf("no source = %+v; want the zero Source (fulcrum's own address)", s)
	}
	for _, c := range []struct{ value, want string }{
		{`"10.0.0.5"`, `f.toml:4: services.pg.source: "10.0.0.5" is neither "client"`},
		{`["10.0.0.5", "10.0.0.6"]`, `f.toml:4: services.pg.source: a pool of egress addresses [10.0.0.5, 10.0.0.6] is not yet supported; source = "client" is`},
		{`["10.0.0.5", "eth0"]`, `f.toml:4: services.pg.source[1]: "eth0" is not an IP address`},
		{`[]`, `f.toml:4: services.pg.source: an empty array`},
		{`true`, `f.toml:4: services.pg.source: want "client" or an array of addresses, have boolean`},
	} {
		_, err := Parse("f.toml", []byte(head+"source = "+c.value+"\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("source = %s: %v; want %q", c.value, err, c.want)
		}
	}
}
