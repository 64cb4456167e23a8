package testkit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TLS-only database servers and clients with certificates of the test's
// own CA, for checks that must verify what they reach:
//
//	ca := testkit.NewCA(t)
//	r := testkit.StartRedisTLS(t, ca)          // --port 0 --tls-port …
//	crt, key := ca.ClientFiles(t, "fulcrum")   // a client certificate
//	srv := testkit.NewMTLSServer(t, ca, h)     // HTTPS demanding one

// IssueClient returns a client certificate (ExtKeyUsageClientAuth) with
// the common name name.
func (ca *CA) IssueClient(t testing.TB, name string) tls.Certificate {
	t.Helper()
	return ca.sign(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// ClientFiles issues a client certificate and writes it and its key as PEM
// files in a directory of their own; it returns their paths.
func (ca *CA) ClientFiles(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return WritePair(t, t.TempDir(), ca.IssueClient(t, name))
}

// ServerFiles issues a server certificate for names (and 127.0.0.1) and
// writes it, its key and the CA's certificate in a directory of their
// own that any user may read (servers such as mariadbd run as their own
// user; the key is a throwaway's). It returns the three paths.
func (ca *CA) ServerFiles(t testing.TB, names ...string) (certFile, keyFile, caFile string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fulcrum-certs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	certFile, keyFile = WritePair(t, dir, ca.Issue(t, names...))
	os.Chmod(keyFile, 0o644)
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, caFile
}

// StartRedisTLS starts a redis-server that listens for TLS only (--port 0
// --tls-port), with a certificate of ca for localhost and 127.0.0.1, and
// that requires a client certificate of ca when clientAuth is set.
// Addr is the TLS port. Do does not work on it (it speaks plain TCP).
func StartRedisTLS(t testing.TB, ca *CA, clientAuth bool, extra ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(t, "redis-server")
	}
	crt, key, caFile := ca.ServerFiles(t, "localhost")
	auth := "no"
	if clientAuth {
		auth = "yes"
	}
	r := &Redis{Port: freePort(t)}
	r.Addr = fmt.Sprintf("127.0.0.1:%d", r.Port)
	r.args = append([]string{"--port", "0", "--tls-port", fmt.Sprint(r.Port), "--bind", "127.0.0.1",
		"--tls-cert-file", crt, "--tls-key-file", key, "--tls-ca-cert-file", caFile, "--tls-auth-clients", auth,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--dir", t.TempDir()}, extra...)
	r.Start(t)
	t.Cleanup(r.Kill)
	return r
}

// NewMTLSServer serves handler over HTTPS on 127.0.0.1 with a certificate
// of ca, and refuses any client without a client certificate of ca (as
// Patroni's REST API does with verify_client: required). It returns the
// address; the test's cleanup closes it and waits for its goroutine.
func NewMTLSServer(t testing.TB, ca *CA, handler http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{
		Handler: handler,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost")},
			ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert},
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan struct{})
	go func() { // exits when Close closes ln
		defer close(done)
		hs.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		hs.Close()
		<-done
	})
	return ln.Addr().String()
}

// HostSSLOnly serves a certificate of ca (for localhost and 127.0.0.1)
// with ssl = on and takes TCP sessions over TLS only (hostnossl …
// reject before every other rule), as a PostgreSQL that requires TLS is
// set up.
func (p *Postgres) HostSSLOnly(t testing.TB, ca *CA) {
	t.Helper()
	p.EnableTLS(t, "tls-only", ca.Issue(t, "localhost"))
	hba := filepath.Join(p.Dir, "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, hba, "hostnossl all all 127.0.0.1/32 reject\n"+string(b))
	run(t, "chown", "postgres:postgres", hba)
	p.Ctl(t, "reload")
	WaitFor(t, 10*time.Second, func() error { // a reload gives no event but its effect: a plain login refused
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgconn.Connect(ctx, "postgres://postgres@"+p.Addr+"/postgres?sslmode=disable")
		cancel()
		if err != nil {
			return nil
		}
		c.Close(context.Background())
		return errors.New("a plain login still works after the reload")
	})
}
