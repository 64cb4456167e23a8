package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fulcrum/health"
	"fulcrum/internal/testkit"
)

// TestHealthTLS: the tls keys reach every backend with their files read
// from the config file's directory and tls_verify defaulting to true; a
// backend overrides single keys; send_proxy takes the backend's
// proxy_protocol.
func TestHealthTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t)
	crt, key := testkit.WritePair(t, dir, ca.IssueClient(t, "fulcrum"))
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "fulcrum.toml"), []byte(`
[services.r]
listen = ["127.0.0.1:1"]
proxy_protocol = "v2"
[services.r.health]
check = "redis"
tls = true
tls_ca = "ca.pem"
tls_cert = "server.crt"
tls_key = "server.key"
send_proxy = true
[[services.r.backends]]
address = "127.0.0.1:2"
[[services.r.backends]]
address = "127.0.0.1:3"
proxy_protocol = "v1"
health = { tls_verify = false, tls_server_name = "redis.internal" }
`))
	if err != nil {
		t.Fatal(err)
	}
	b0, b1 := cfg.Services[0].Backends[0], cfg.Services[0].Backends[1]
	want := health.TLS{On: true, CA: filepath.Join(dir, "ca.pem"), Cert: crt, Key: key}
	if b0.Health.TLS != want || !b0.Health.SendProxy || b0.ProxyProtocol != 2 {
		t.Errorf("backend 0 health TLS = %+v, send_proxy %v, proxy %d; want %+v, true, 2", b0.Health.TLS, b0.Health.SendProxy, b0.ProxyProtocol, want)
	}
	want.SkipVerify, want.ServerName = true, "redis.internal"
	if b1.Health.TLS != want || b1.ProxyProtocol != 1 {
		t.Errorf("backend 1 health TLS = %+v, proxy %d; want %+v, 1", b1.Health.TLS, b1.ProxyProtocol, want)
	}
	if c, err := b0.Health.TLS.Config("127.0.0.1"); err != nil || c.ServerName != "127.0.0.1" || c.InsecureSkipVerify || len(c.Certificates) != 1 || c.RootCAs == nil {
		t.Errorf("Config = %+v, %v", c, err)
	}
}

// TestHealthTLSErrors: a missing file, a key that is not the certificate's,
// tls keys without tls = true and send_proxy without proxy_protocol are
// located errors.
func TestHealthTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t)
	crt, _ := testkit.WritePair(t, dir, ca.IssueClient(t, "a"))
	_, otherKey := testkit.WritePair(t, t.TempDir(), ca.IssueClient(t, "b"))
	ok := "[services.s]\nlisten = [\"127.0.0.1:1\"]\nbackends = [{address = \"127.0.0.1:2\"}]\n[services.s.health]\ncheck = \"redis\"\n"
	tests := []struct{ name, src, want string }{
		{"missing CA", ok + "tls = true\ntls_ca = \"/nonexistent/ca.pem\"\n", `f.toml:6: services.s.health.tls: tls_ca: open /nonexistent/ca.pem: no such file or directory`},
		{"CA not PEM", ok + "tls = true\ntls_ca = \"" + filepath.Join(dir, "server.key") + "\"\n", `services.s.health.tls: tls_ca: no PEM certificate in`},
		{"key of another certificate", ok + "tls = true\ntls_cert = \"" + crt + "\"\ntls_key = \"" + otherKey + "\"\n", `services.s.health.tls: tls_cert, tls_key: tls: private key does not match public key`},
		{"cert without key", ok + "tls = true\ntls_cert = \"" + crt + "\"\n", `services.s.health.tls: tls_cert and tls_key go together`},
		{"tls keys without tls", ok + "tls_server_name = \"db\"\n", `services.s.backends[0].health.tls: tls_ca, tls_cert, tls_key, tls_server_name and tls_verify need tls = true`},
		{"send_proxy without proxy_protocol", ok + "send_proxy = true\n", `services.s.backends[0].health.send_proxy: send_proxy sends the header proxy_protocol names; set proxy_protocol = "v1" or "v2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.toml", []byte(tt.src))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v; want an error with %q", err, tt.want)
			}
		})
	}
}
