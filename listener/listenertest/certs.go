package listenertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
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
