package reload

import (
	"testing"

	"fulcrum/conf"
)

// TestPolicyPostgres: protocol decides whether the listener looks for
// PostgreSQL cancel requests, and "auto" follows the checks.
func TestPolicyPostgres(t *testing.T) {
	for _, tc := range []struct {
		name, settings string
		want           bool
	}{
		{"pgsql check", "health = { check = \"pgsql\" }\n", true},
		{"tcp check", "health = { check = \"tcp\" }\n", false},
		{"patroni's REST check, said", "protocol = \"postgres\"\nhealth = { check = \"http\", port = 8008, path = \"/primary\" }\n", true},
		{"opted out", "protocol = \"tcp\"\nhealth = { check = \"pgsql\" }\n", false},
		{"no check", "", false},
	} {
		text := "[services.s]\nlisten = [\"127.0.0.1:0\"]\npreread_timeout = \"2s\"\n" + tc.settings + "[[services.s.backends]]\naddress = \"127.0.0.1:5432\"\n"
		cfg, err := conf.Parse("t.toml", []byte(text))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		pol := policy(cfg, cfg.Services[0])
		if pol.Postgres != tc.want || pol.PrereadTimeout.String() != "2s" {
			t.Errorf("%s: Postgres %v, PrereadTimeout %s; want %v, 2s", tc.name, pol.Postgres, pol.PrereadTimeout, tc.want)
		}
	}
	if _, err := conf.Parse("t.toml", []byte("[services.s]\nlisten = [\"127.0.0.1:0\"]\nprotocol = \"mysql\"\n[[services.s.backends]]\naddress = \"127.0.0.1:1\"\n")); err == nil {
		t.Error("protocol = \"mysql\" accepted")
	} else {
		t.Log(err)
	}
}
