package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestDaemonRoutesPostgres: two PostgreSQL clusters with ssl = on and their
// own certificates behind one fulcrum port. psql with sslmode=verify-full
// reaches each by host name (libpq sends SNI after the SSLRequest fulcrum
// answers); sslmode=disable reaches the default route. The access log
// carries the service and the name.
func TestDaemonRoutesPostgres(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts two PostgreSQL clusters")
	}
	ca := testkit.NewCA(t)
	pg1, pg2 := testkit.StartPostgres(t), testkit.StartPostgres(t)
	pg1.EnableTLS(t, "db1", ca.Issue(t, "db1.example.com"))
	pg2.EnableTLS(t, "db2", ca.Issue(t, "db2.example.com"))
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[services.db1]
listen = ["127.0.0.1:0"]
sni = ["db1.example.com"]
backends = [{ name = "pg1", address = %q }]
[services.db2]
listen = ["127.0.0.1:0"]
sni = ["db2.example.com", "*"]
backends = [{ name = "pg2", address = %q }]
`, pg1.Addr, pg2.Addr))
	addr := d.listenAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	for _, tc := range []struct{ conn, want, service, sni string }{
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db1 t", "db1", "db1.example.com"},
		{"host=db2.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db2 t", "db2", "db2.example.com"},
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=disable", "db2 f", "db2", ""},
	} {
		conn := tc.conn + " port=" + port + " user=postgres dbname=postgres gssencmode=disable connect_timeout=20"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, pg1.Bin("psql"), "-XAt", "-F", " ", "-d", conn,
			"-c", "select current_setting('cluster_name'), ssl from pg_stat_ssl where pid = pg_backend_pid()").CombinedOutput()
		cancel()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("psql %q = %q, %v; want %q", tc.conn, out, err, tc.want)
			continue
		}
		d.awaitMatch(t, "the access line of "+tc.service, func(m map[string]any) bool {
			sni, _ := m["sni"].(string)
			return m["message"] == "connection" && m["service"] == tc.service && sni == tc.sni
		})
	}
}

// clientHello returns the TLS records of a ClientHello for server name, as
// crypto/tls sends it.
func clientHello(t *testing.T, name string) []byte {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { // exits when b is closed under the handshake
		defer close(done)
		tls.Client(a, &tls.Config{ServerName: name}).Handshake()
		a.Close()
	}()
	defer func() { b.Close(); <-done }()
	var hdr [5]byte
	if _, err := io.ReadFull(b, hdr[:]); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr[:])
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestDaemonRoutesReload: a reload that adds a service to a routed address
// routes its name from then on, and -check prints the address's routes.
func TestDaemonRoutesReload(t *testing.T) {
	ca := testkit.NewCA(t)
	a := testkit.NewTLSServer(t, ca, "a", "a.example.com")
	b := testkit.NewTLSServer(t, ca, "b", "b.example.com")
	def := testkit.NewTLSServer(t, ca, "default", "default.example.com")
	// Port 0 is one address to the reload (it keeps the socket it bound).
	conf1 := fmt.Sprintf(`
[log]
format = "json"
[services.a]
listen = ["127.0.0.1:0"]
sni = ["a.example.com"]
backends = [{ address = %q }]
[services.default]
listen = ["127.0.0.1:0"]
sni = ["*"]
backends = [{ address = %q }]
`, a.Addr, def.Addr)
	conf2 := conf1 + fmt.Sprintf(`
[services.b]
listen = ["127.0.0.1:0"]
sni = ["b.example.com"]
alpn = ["h2"]
backends = [{ address = %q }]
`, b.Addr)

	path := writeFile(t, "fulcrum.toml", conf2)
	var out, errOut bytes.Buffer
	if code := cli([]string{"-check", "-config", path}, &out, &errOut); code != 0 {
		t.Fatalf("-check = %d: %s", code, errOut.String())
	}
	summary := strings.Join(strings.Fields(out.String()), " ")
	if want := "routes on 127.0.0.1:0 preread_timeout 5s sni alpn service a.example.com any a b.example.com h2 b * (default: no or unknown SNI, no TLS) any default"; !strings.Contains(summary, want) {
		t.Errorf("-check lacks %q:\n%s", want, out.String())
	}

	replaceFile(t, path, []byte(conf1))
	d := startDaemonArgs(t, []string{"-config", path}, nil, nil)
	addr := d.listenAddr(t)
	served := func(name string, alpn ...string) string {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{ServerName: name, RootCAs: ca.Pool, NextProtos: alpn, InsecureSkipVerify: true})
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served("b.example.com", "h2"); got != "default.example.com" {
		t.Errorf("before the reload, b.example.com reached %q; want the default", got)
	}
	replaceFile(t, path, []byte(conf2))
	d.await(t, "reload applied")
	for _, tc := range []struct {
		name string
		alpn []string
		want string
	}{
		{"a.example.com", nil, "a.example.com"},
		{"b.example.com", []string{"h2"}, "b.example.com"},
		{"b.example.com", []string{"http/1.1"}, "default.example.com"},
		{"c.example.com", nil, "default.example.com"},
	} {
		if got := served(tc.name, tc.alpn...); got != tc.want {
			t.Errorf("after the reload, %s %v reached %q; want %q", tc.name, tc.alpn, got, tc.want)
		}
	}
}
