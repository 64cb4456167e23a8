package health

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// wantCertError checks that err is a check failure naming a certificate
// that does not verify.
func wantCertError(t *testing.T, what string, err error) {
	t.Helper()
	var ce *CertError
	t.Logf("%s: %v", what, err)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("%s: %v; want a certificate that does not verify", what, err)
	}
}

// tlsCases runs a probe built by mk against a server of ca: with ca and a
// client certificate it is up; with another CA, or for another name, down
// with the certificate's reason; with tls_verify = false and another CA, up.
func tlsCases(t *testing.T, ca *testkit.CA, mk func(TLS) *Probe) {
	t.Helper()
	crt, key := ca.ClientFiles(t, "fulcrum")
	other := testkit.NewCA(t)
	good := TLS{On: true, CA: ca.File, Cert: crt, Key: key}
	if err := mk(good).Run(t.Context()); err != nil {
		t.Errorf("verified: %v; want up", err)
	}
	named := good
	named.ServerName = "localhost"
	if err := mk(named).Run(t.Context()); err != nil {
		t.Errorf("tls_server_name = localhost: %v; want up", err)
	}
	wrong := good
	wrong.CA = other.File
	wantCertError(t, "wrong CA", mk(wrong).Run(t.Context()))
	misnamed := good
	misnamed.ServerName = "db.example"
	wantCertError(t, "tls_server_name of another host", mk(misnamed).Run(t.Context()))
	unverified := wrong
	unverified.SkipVerify = true
	if err := mk(unverified).Run(t.Context()); err != nil {
		t.Errorf("tls_verify = false, wrong CA: %v; want up", err)
	}
}

// TestTLSHTTP: an HTTPS server that demands a client certificate (Patroni's
// verify_client: required).
func TestTLSHTTP(t *testing.T) {
	ca := testkit.NewCA(t)
	addr := testkit.NewMTLSServer(t, ca, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/primary" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	mk := func(s TLS) *Probe {
		return &Probe{Kind: CheckHTTP, Addr: addr, Timeout: 5 * time.Second, Path: "/primary", Status: 200, TLS: s}
	}
	tlsCases(t, ca, mk)
	if err := mk(TLS{On: true, CA: ca.File}).Run(t.Context()); err == nil {
		t.Error("no client certificate: up; want down")
	}
	if err := mk(TLS{}).Run(t.Context()); err == nil {
		t.Error("plain HTTP to an HTTPS server: up; want down")
	}
}

// TestTLSRedis: a TLS-only redis-server (--port 0 --tls-port) that wants a
// client certificate, by PING and by a role check.
func TestTLSRedis(t *testing.T) {
	ca := testkit.NewCA(t)
	r := testkit.StartRedisTLS(t, ca, true)
	tlsCases(t, ca, func(s TLS) *Probe { return &Probe{Kind: CheckRedis, Addr: r.Addr, Timeout: 5 * time.Second, TLS: s} })
	crt, key := ca.ClientFiles(t, "fulcrum")
	p := &Probe{Kind: CheckRedis, Addr: r.Addr, Timeout: 5 * time.Second, Role: backend.RolePrimary, TLS: TLS{On: true, CA: ca.File, Cert: crt, Key: key}}
	wantRole(t, "role over TLS", p, backend.RolePrimary, "")
	if err := (&Probe{Kind: CheckRedis, Addr: r.Addr, Timeout: 5 * time.Second}).Run(t.Context()); err == nil {
		t.Error("plain PING to a TLS-only Redis: up; want down")
	}
}

// TestTLSPostgres: PostgreSQL with ssl = on that takes TCP sessions over
// TLS only (hostnossl … reject), by the startup check and by a login.
func TestTLSPostgres(t *testing.T) {
	ca := testkit.NewCA(t)
	pg := testkit.StartPostgres(t)
	pg.HostSSLOnly(t, ca)
	t.Run("startup", func(t *testing.T) {
		tlsCases(t, ca, func(s TLS) *Probe { return &Probe{Kind: CheckPgSQL, Addr: pg.Addr, Timeout: 5 * time.Second, TLS: s} })
	})
	t.Run("login", func(t *testing.T) {
		tlsCases(t, ca, func(s TLS) *Probe {
			return &Probe{Kind: CheckPgSQL, Addr: pg.Addr, Timeout: 5 * time.Second, User: "postgres", Role: backend.RolePrimary, TLS: s}
		})
	})
}

// TestTLSMariaDB: MariaDB with require_secure_transport, by a login that
// knows no role and by a role check.
func TestTLSMariaDB(t *testing.T) {
	ca := testkit.NewCA(t)
	crt, key, caFile := ca.ServerFiles(t, "localhost")
	m := testkit.StartMariaDB(t, "--ssl-cert="+crt, "--ssl-key="+key, "--ssl-ca="+caFile, "--require-secure-transport=ON")
	pw := secret(t, testkit.MD5Password)
	m.Exec(t, "GRANT REPLICATION CLIENT ON *.* TO checker@'%'")
	t.Run("login", func(t *testing.T) {
		tlsCases(t, ca, func(s TLS) *Probe {
			return &Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "fulcrum", TLS: s}
		})
	})
	t.Run("role", func(t *testing.T) {
		tlsCases(t, ca, func(s TLS) *Probe {
			return &Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: backend.RolePrimary, TLS: s}
		})
	})
	if err := (&Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: backend.RolePrimary}).Run(t.Context()); err == nil {
		t.Error("a plain login where require_secure_transport is on: up; want down")
	} else {
		t.Logf("plain: %v", err)
	}
}
