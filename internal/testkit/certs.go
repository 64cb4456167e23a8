package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a throwaway certificate authority of the test's own, for TLS
// servers behind a proxy: which certificate a client sees proves which
// backend it reached.
type CA struct {
	Pool    *x509.CertPool
	CertPEM []byte
	File    string // CertPEM written in the test's temporary directory
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	serial  atomic.Int64
}

// NewCA makes a CA valid for an hour.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fulcrum test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Pool: x509.NewCertPool(), cert: cert, key: key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.Pool.AddCert(cert)
	ca.serial.Store(1)
	ca.File = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca.File, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

// Issue returns a server certificate for the given DNS names, its common
// name the first of them.
func (ca *CA) Issue(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	return ca.sign(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: names[0]},
		DNSNames:    names,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// sign gives tmpl a fresh P-256 key, the next serial number and an hour
// either side of now, and returns it signed by the CA.
func (ca *CA) sign(t testing.TB, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(ca.serial.Add(1))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WritePair writes a certificate and its key as PEM files (server.crt and
// server.key in dir, mode 0600 for the key, as PostgreSQL requires).
func WritePair(t testing.TB, dir string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	kder, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TLSServer is an HTTPS server on 127.0.0.1 that answers every request
// with its name and the protocol ALPN chose, as "name proto\n".
type TLSServer struct {
	Addr string
	Name string
}

// NewTLSServer serves HTTPS (h2 and http/1.1) with a certificate for
// names; the test's cleanup closes it and waits for its goroutines.
func NewTLSServer(t testing.TB, ca *CA, name string, names ...string) *TLSServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, names...)}, NextProtos: []string{"h2", "http/1.1"}}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(name + " " + r.Proto + "\n"))
		}),
		TLSConfig:         cfg,
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
	return &TLSServer{Addr: ln.Addr().String(), Name: name}
}

// EnableTLS gives the cluster a server certificate (ssl = on, and
// cluster_name = name, which SHOW cluster_name answers), reloads it and
// waits until it accepts an SSLRequest.
func (p *Postgres) EnableTLS(t testing.TB, name string, cert tls.Certificate) {
	t.Helper()
	certFile, keyFile := WritePair(t, p.Dir, cert)
	if out, err := exec.Command("chown", "postgres:postgres", certFile, keyFile).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	conf := fmt.Sprintf("ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\ncluster_name = '%s'\n", certFile, keyFile, name)
	appendFile(t, filepath.Join(p.Dir, "postgresql.conf"), conf)
	p.Stop(t, "fast") // cluster_name needs a restart
	p.Start(t)
	WaitFor(t, 20*time.Second, func() error { // a restart gives no event but its effect
		if !AcceptsSSL(p.Addr) {
			return fmt.Errorf("PostgreSQL on %s does not accept SSLRequest after ssl = on", p.Addr)
		}
		return nil
	})
}

// AcceptsSSL reports whether the PostgreSQL server at addr answers an
// SSLRequest with 'S'.
func AcceptsSSL(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return false
	}
	var b [1]byte
	_, err = io.ReadFull(c, b[:])
	return err == nil && b[0] == 'S'
}
