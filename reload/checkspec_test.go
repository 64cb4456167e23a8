package reload

import (
	"testing"

	"fulcrum/conf"
	"fulcrum/health"
)

// TestCheckSpecTLSProxy: a backend's tls keys and send_proxy reach its
// probe, send_proxy as the version of the backend's proxy_protocol, and
// port = N moves the probe's address.
func TestCheckSpecTLSProxy(t *testing.T) {
	cfg, err := conf.Parse("f.toml", []byte(`
[services.s]
listen = ["127.0.0.1:1"]
proxy_protocol = "v1"
health = { check = "redis", tls = true, tls_verify = false, tls_server_name = "db", send_proxy = true, port = 16379 }
[[services.s.backends]]
address = "127.0.0.1:2"
[[services.s.backends]]
address = "127.0.0.1:3"
proxy_protocol = "v2"
health = { send_proxy = false }
`))
	if err != nil {
		t.Fatal(err)
	}
	bs := cfg.Services[0].Backends
	p0, p1 := checkSpec(bs[0], nil).Probe, checkSpec(bs[1], nil).Probe
	want := health.TLS{On: true, SkipVerify: true, ServerName: "db"}
	if p0.TLS != want || p0.SendProxy != 1 || p0.Addr != "127.0.0.1:16379" {
		t.Errorf("backend 0 probe TLS %+v, send_proxy %d, addr %s; want %+v, 1, 127.0.0.1:16379", p0.TLS, p0.SendProxy, p0.Addr, want)
	}
	if p1.TLS != want || p1.SendProxy != 0 {
		t.Errorf("backend 1 probe TLS %+v, send_proxy %d; want %+v, 0", p1.TLS, p1.SendProxy, want)
	}

	// A backend named by host: the certificate is checked for the name,
	// not for the address it resolves to.
	cfg, err = conf.Parse("f.toml", []byte(`
[services.s]
listen = ["127.0.0.1:1"]
health = { check = "redis", tls = true }
backends = [{ address = "localhost:6380" }, { address = "127.0.0.1:6381", health = { tls_server_name = "r2" } }]
`))
	if err != nil {
		t.Fatal(err)
	}
	bs = cfg.Services[0].Backends
	if p := checkSpec(bs[0], nil).Probe; p.TLS.ServerName != "localhost" {
		t.Errorf("backend by name: tls server name %q; want localhost", p.TLS.ServerName)
	}
	if p := checkSpec(bs[1], nil).Probe; p.TLS.ServerName != "r2" {
		t.Errorf("backend with tls_server_name: %q; want r2", p.TLS.ServerName)
	}
}
