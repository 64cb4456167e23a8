package conf

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

const routed = `
[services.db1]
listen = ["127.0.0.1:5432"]
sni = ["DB1.example.com"]
backends = [{address = "127.0.0.1:15432"}]

[services.tenants]
listen = ["127.0.0.1:5432"]
sni = ["*.tenants.example.com", "tenants.example.com"]
preread_timeout = "10s"
backends = [{address = "127.0.0.1:15433"}]

[services.web2]
listen = ["127.0.0.1:5432"]
sni = ["app.example.com"]
alpn = ["h2"]
backends = [{address = "127.0.0.1:15434"}]

[services.web1]
listen = ["127.0.0.1:5432"]
sni = ["app.example.com"]
alpn = ["http/1.1"]
backends = [{address = "127.0.0.1:15435"}]

[services.legacy]
listen = ["127.0.0.1:5432", "127.0.0.1:5433"]
sni = ["*"]
backends = [{address = "127.0.0.1:15436"}]

[services.plain]
listen = ["127.0.0.1:6000"]
backends = [{address = "127.0.0.1:15437"}]
`

// TestRoutesParse: services naming what they take share an address; the
// names are lowercased, and -check prints the routes in the order a name
// is tried.
func TestRoutesParse(t *testing.T) {
	cfg, err := Parse("f.toml", []byte(routed))
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddrPort("127.0.0.1:5432"), netip.MustParseAddrPort("127.0.0.1:5433")
	routed := cfg.Routed()
	if len(routed) != 2 || routed[a] == nil || routed[b] == nil {
		t.Errorf("Routed() = %v; want %s and %s", routed, a, b)
	}
	var names []string
	for _, s := range routed[a] {
		names = append(names, s.Name)
	}
	if want := []string{"db1", "tenants", "web2", "web1", "legacy"}; !slices.Equal(names, want) {
		t.Errorf("Routed()[%s] = %q; want %q", a, names, want)
	}
	db1 := routed[a][0]
	if !slices.Equal(db1.SNI, []string{"db1.example.com"}) || db1.ALPN != nil || db1.PrereadTimeout != 5*time.Second {
		t.Errorf("db1: sni %q alpn %q preread_timeout %s; want [db1.example.com] [] 5s", db1.SNI, db1.ALPN, db1.PrereadTimeout)
	}
	var out bytes.Buffer
	cfg.WriteSummary(&out)
	summary := strings.Join(strings.Fields(strings.ReplaceAll(out.String(), "\n", " | ")), " ")
	for _, want := range []string{
		"routes on 127.0.0.1:5432 preread_timeout 10s | sni alpn service | db1.example.com any db1 | tenants.example.com any tenants | " +
			"app.example.com h2 web2 | app.example.com http/1.1 web1 | *.tenants.example.com any tenants | " +
			"* (default: no or unknown SNI, no TLS) any legacy |",
		"routes on 127.0.0.1:5433 preread_timeout 5s | sni alpn service | * (default: no or unknown SNI, no TLS) any legacy",
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "routes on 127.0.0.1:6000") {
		t.Errorf("summary lists routes for an address without sni:\n%s", out.String())
	}
}

// TestRoutesErrors: each broken rule is reported at its key.
func TestRoutesErrors(t *testing.T) {
	svc := func(name, extra string) string {
		return "[services." + name + "]\nlisten = [\"127.0.0.1:1\"]\n" + extra + "backends = [{address = \"127.0.0.1:2\"}]\n"
	}
	for _, tc := range []struct{ name, src, want string }{
		{"plain shares", svc("a", "sni = [\"a.example\"]\n") + svc("b", ""),
			`f.toml:6: services.b.listen[0]: 127.0.0.1:1 is also listened on by services.a.listen[0]; services may share an address only when each names what it takes`},
		{"same name", svc("a", "sni = [\"a.example\"]\n") + svc("b", "sni = [\"x.example\", \"A.example\"]\n"),
			`f.toml:7: services.b.sni[1]: "a.example" on 127.0.0.1:1 is already taken by services.a.sni[0]`},
		{"same wildcard", svc("a", "sni = [\"*.example\"]\n") + svc("b", "sni = [\"*.example\"]\n"),
			`services.b.sni[0]: "*.example" on 127.0.0.1:1 is already taken by services.a.sni[0]`},
		{"same name and protocol", svc("a", "sni = [\"a.example\"]\nalpn = [\"h2\"]\n") + svc("b", "sni = [\"a.example\"]\nalpn = [\"h2\", \"http/1.1\"]\n"),
			`services.b.sni[0]: "a.example" with ALPN "h2" on 127.0.0.1:1 is already taken by services.a.sni[0]`},
		{"two defaults", svc("a", "sni = [\"*\"]\n") + svc("b", "sni = [\"*\"]\n"),
			`f.toml:7: services.b.sni[0]: services.a is already the default route on 127.0.0.1:1`},
		{"alpn on the default", svc("a", "sni = [\"*\"]\nalpn = [\"h2\"]\n"), `f.toml:4: services.a.alpn: the default route (sni = ["*"]) takes every client`},
		{"alpn without sni", svc("a", "alpn = [\"h2\"]\n"), `f.toml:3: services.a.alpn: narrows the routes that sni names`},
		{"empty sni", svc("a", "sni = []\n"), `f.toml:3: services.a.sni: is empty`},
		{"inner wildcard", svc("a", "sni = [\"a.*.example\"]\n"), `f.toml:3: services.a.sni[0]: sni "a.*.example": a wildcard may only be a whole first label`},
		{"unicode", svc("a", "sni = [\"bücher.example\"]\n"), `services.a.sni[0]: sni "bücher.example": write an internationalised name as clients send it, in its xn-- form`},
		{"empty alpn", svc("a", "sni = [\"a.example\"]\nalpn = [\"\"]\n"), `f.toml:4: services.a.alpn[0]: a protocol name has 1 to 255 bytes`},
		{"accept_proxy differs", svc("a", "sni = [\"a.example\"]\naccept_proxy = [\"10.0.0.1\"]\n") + svc("b", "sni = [\"b.example\"]\n"),
			`services.b.accept_proxy: differs from services.a's on the shared address 127.0.0.1:1`},
		{"bad preread_timeout", svc("a", "sni = [\"a.example\"]\npreread_timeout = \"0s\"\n"), `f.toml:4: services.a.preread_timeout: must be at least 1ms`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("f.toml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse =\n%v\nwant an error containing\n%s", err, tc.want)
			}
		})
	}
	// Distinct protocols may share a name, and so may a service with alpn
	// and one without, which takes the other clients (docs/routing.md,
	// "How a client is routed"); an sni service may be alone.
	for _, src := range []string{
		svc("a", "sni = [\"a.example\"]\nalpn = [\"h2\"]\n") + svc("b", "sni = [\"a.example\"]\nalpn = [\"postgresql\"]\n"),
		svc("a", "sni = [\"a.example\"]\nalpn = [\"h2\"]\n") + svc("b", "sni = [\"a.example\"]\n"),
		svc("b", "sni = [\"a.example\", \"*.example\"]\n") + svc("a", "sni = [\"a.example\"]\nalpn = [\"h2\"]\n"),
		svc("a", "sni = [\"a.example\"]\n"),
	} {
		if _, err := Parse("f.toml", []byte(src)); err != nil {
			t.Errorf("Parse(%q) = %v; want nil", src, err)
		}
	}
}
