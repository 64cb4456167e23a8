package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/pires/go-proxyproto"
)

// TLS is how a check speaks TLS to its backend: the tls_* keys of a
// [health] table. The zero value is no TLS. With On, the server's
// certificate must verify against CA (or the system's roots when CA is
// "") for ServerName, unless SkipVerify; a certificate that does not
// verify fails the check with that reason.
//
// The files are read at every check (Config), as password_file is, so that
// a renewed certificate needs no reload.
type TLS struct {
	On         bool   // tls = true; false: the kind's plain protocol (pgsql still takes TLS when offered, unverified)
	CA         string // tls_ca: PEM file of the certificates to trust; "" = the system's roots
	Cert, Key  string // tls_cert, tls_key: PEM files of a client certificate and its key; "" = none (both or neither)
	ServerName string // tls_server_name: the name the certificate must carry; "" = the host of the checked address
	SkipVerify bool   // tls_verify = false: take any certificate (the default, false, verifies)
}

// Config reads the files and returns the client configuration a check (or
// any other client of the backend's checks, such as a REST call) uses to
// reach host, the host of the address it dials (an IP address or a name),
// which is the name verified when ServerName is "". nil, nil when TLS is
// not On.
func (t TLS) Config(host string) (*tls.Config, error) {
	if !t.On {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.SkipVerify}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca: no PEM certificate in %s", t.CA)
		}
		cfg.RootCAs = pool
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("tls_cert and tls_key go together")
	}
	if t.Cert != "" {
		c, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls_cert, tls_key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// tlsConfig is the probe's TLS configuration for its address; nil when
// its TLS is not On.
func (p *Probe) tlsConfig() (*tls.Config, error) {
	host, _, err := net.SplitHostPort(p.Addr)
	if err != nil {
		host = p.Addr
	}
	return p.TLS.Config(host)
}

// CertError is a check whose server's certificate did not verify: the
// check fails, and says why.
type CertError struct {
	Addr string
	Err  error // from crypto/x509, or crypto/tls's verification
}

func (e *CertError) Error() string {
	return "TLS certificate of " + e.Addr + " does not verify: " + e.Err.Error()
}

func (e *CertError) Unwrap() error { return e.Err }

// certCause names a certificate of addr that did not verify as a
// *CertError; any other error is returned as it is.
func certCause(addr string, err error) error {
	var ce *CertError
	if err == nil || errors.As(err, &ce) {
		return err
	}
	var (
		ve *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &ve):
		return &CertError{Addr: addr, Err: ve.Err}
	case errors.As(err, &ua):
		return &CertError{Addr: addr, Err: ua}
	case errors.As(err, &he):
		return &CertError{Addr: addr, Err: he}
	case errors.As(err, &ci):
		return &CertError{Addr: addr, Err: ci}
	}
	return err
}

// tlsFailed says a handshake with addr failed; a *CertError says so
// itself.
func tlsFailed(addr string, err error) error {
	var ce *CertError
	if errors.As(err, &ce) {
		return err
	}
	return fmt.Errorf("TLS with %s: %w", addr, err)
}

// handshake runs a TLS handshake with addr over c, within ctx: every
// check's, and Patroni's REST call. A certificate that does not verify is
// a *CertError.
func handshake(ctx context.Context, c net.Conn, cfg *tls.Config, addr string) (*tls.Conn, error) {
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, tlsFailed(addr, certCause(addr, err))
	}
	return tc, nil
}

// dial connects to addr and, with SendProxy, writes the PROXY header the
// service sends its backends, with the check connection's own addresses
// (fulcrum's, and the backend's) as source and destination. Every kind
// dials here, the database drivers through their DialFunc, so a backend
// that requires the header sees it before anything else.
func (p *Probe) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := p.netDialer().DialContext(ctx, network, addr)
	if err != nil || p.SendProxy == 0 {
		return c, err
	}
	h := proxyproto.HeaderProxyFromAddrs(byte(p.SendProxy), c.LocalAddr(), c.RemoteAddr())
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	if _, err := h.WriteTo(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("send PROXY header to %s: %w", addr, err)
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}
