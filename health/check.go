package health

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"fulcrum/backend"
)

// CheckKind names a kind of active check; the configuration's check key
// takes these names.
type CheckKind string

// The check kinds.
const (
	CheckNone       CheckKind = "none"        // no active check: passive failures only
	CheckTCP        CheckKind = "tcp"         // a connect
	CheckSendExpect CheckKind = "send-expect" // send bytes, match the answer
	CheckPgSQL      CheckKind = "pgsql"       // a startup message, or a login that asks the role
	CheckRedis      CheckKind = "redis"       // PING, or ROLE
	CheckMySQL      CheckKind = "mysql"       // a login that asks the role
	CheckHTTP       CheckKind = "http"        // GET a path, expect a status
)

// CheckKinds lists the check kinds, in the documentation's order.
var CheckKinds = []CheckKind{CheckNone, CheckTCP, CheckSendExpect, CheckPgSQL, CheckRedis, CheckMySQL, CheckHTTP}

// TellsRoles reports whether a check of kind k tells a primary from a
// replica (and so may require a role).
func (k CheckKind) TellsRoles() bool { return k == CheckPgSQL || k == CheckMySQL || k == CheckRedis }

// Probe is one active health check: how to ask a backend whether it is up.
// The zero value is not usable; Kind is required (not CheckNone).
type Probe struct {
	Kind    CheckKind
	Addr    string        // host:port to probe: the backend's, or the configured check address/port
	Timeout time.Duration // for the whole probe: connect, send and answer

	Send   []byte         // send-expect: bytes to send first (may be empty)
	Expect *regexp.Regexp // send-expect: the answer must match within Timeout

	Path   string // http: request path; default "/"
	Status int    // http: expected status; default 200

	User string // pgsql, mysql: the user to log in as; default "fulcrum"

	// Role is the role the backend must answer in: "primary", "replica",
	// or "" / "any" for either. pgsql, mysql and redis tell roles apart;
	// with a role set they log in for real (see the check_*.go files).
	Role string
	// PasswordFile is a file holding the password (pgsql, mysql, redis
	// AUTH), read at each probe so that a rotated password needs no
	// reload; one trailing newline is ignored. "" = no password.
	PasswordFile string
	Database     string        // pgsql: the database to log in to; default "postgres". mysql: none by default
	MaxLag       time.Duration // role "replica" (pgsql, mysql, redis): a replica further behind than this is down; 0 = no limit
	// WAL is where the checks of one service keep the positions their
	// primaries were seen at (pgsql's WAL, mysql's binary log, redis's
	// offset), which its replicas' lag is measured against (see WALClock);
	// reload gives every probe of a service the same one (Controller.WAL).
	// nil: a replica's lag is its own view (see pgRoleQuery).
	WAL *WALClock

	// Patroni is the REST API of the node's Patroni (host:port), pgsql
	// only: a node is a primary only when the database runs as one and
	// GET /primary answers 200, a replica only when it is in recovery and
	// GET /replica answers 200 (see check_patroni.go). "" = the database
	// alone decides.
	Patroni string
	// PatroniTLS, when set, speaks HTTPS to Patroni with it; nil = the
	// checks' TLS settings (TLS.Config for Patroni's host) when TLS.On,
	// else plain HTTP.
	PatroniTLS *tls.Config

	// Sentinels are the host:port addresses of the Redis Sentinels that
	// watch MasterName, redis only: a node that answers role:master is the
	// primary only when a majority of them name its address, Backend (see
	// check_sentinel.go). Empty = the node's own answer decides.
	Sentinels  []string
	MasterName string
	Backend    string // the backend's own host:port, as the Sentinels name it
	// TLS (every kind) is how the check speaks TLS; the zero value is
	// none (pgsql then still takes TLS when offered, unverified).
	TLS TLS
	// SendProxy is the PROXY header version (1 or 2) the check sends
	// first, as the service does to its backends; 0 = none.
	SendProxy int

	dialer *net.Dialer // nil: a zero Dialer. Tests set a source address (MariaDB keeps no host cache for 127.0.0.1)
}

func (p *Probe) netDialer() *net.Dialer {
	if p.dialer != nil {
		return p.dialer
	}
	return &net.Dialer{}
}

// WrongRoleError is the result of a check that reached the backend and
// logged in, and found it in the other role. It makes the backend
// StateWrongRole rather than StateDown.
type WrongRoleError struct {
	Observed, Want string
}

func (e *WrongRoleError) Error() string {
	return "answers as " + e.Observed + ", want " + e.Want
}

// roleWanted reports whether the probe must tell roles apart.
func (p *Probe) roleWanted() bool {
	return p.Role == backend.RolePrimary || p.Role == backend.RoleReplica
}

// verdict turns what Check returned into the probe's result: a
// *WrongRoleError when the backend answered in the other role.
func (p *Probe) verdict(role string, err error) error {
	if err != nil || !p.roleWanted() || role == p.Role {
		return err
	}
	return &WrongRoleError{Observed: role, Want: p.Role}
}

// Run performs the probe once. A nil error means up; a *WrongRoleError
// means it answered in the other role; any other error says why it is down.
func (p *Probe) Run(ctx context.Context) error {
	role, err := p.Check(ctx)
	return p.verdict(role, err)
}

// Answer is what one check learned about a server that answered.
type Answer struct {
	Role string // backend.RolePrimary, backend.RoleReplica, or "" when the check tells none
	// Timeline (pgsql, a primary) is the timeline the server writes WAL
	// on, read from the name of its current WAL file, which a promotion
	// moves at once (pg_control_checkpoint() lags until the next
	// checkpoint). split_brain = "newest" keeps the claimant on the
	// highest. 0 = not known.
	Timeline uint64
	// Lag (a check of a replica) is the replication lag the check
	// measured, negative when there is none to measure (a primary) or it
	// could not; with LagSet false it measured nothing, and the backend
	// keeps its last measure (backend.Check.Lag).
	Lag    time.Duration
	LagSet bool
}

// noLag is a with its lag set to unknown.
func (a Answer) noLag() Answer {
	a.Lag, a.LagSet = -1, true
	return a
}

// password reads PasswordFile; "" when none is set.
func (p *Probe) password() (string, error) {
	if p.PasswordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(p.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("password_file: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	return string(b), nil
}

// Check performs the probe once and returns the role the backend answered
// in ("" when the check does not tell roles apart). A nil error means it
// answered as a working server of its kind, whatever its role.
func (p *Probe) Check(ctx context.Context) (role string, err error) {
	a, err := p.Ask(ctx)
	return a.Role, err
}

// Ask is Check with all the check learned (see Answer).
func (p *Probe) Ask(ctx context.Context) (a Answer, err error) {
	cctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	a, err = p.check(cctx)
	if err != nil && ctx.Err() == nil && (errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) {
		// The probe's deadline closed the socket under a read or a dial:
		// say so, not "use of closed network connection".
		var wr *WrongRoleError
		if !errors.As(err, &wr) {
			err = &TimeoutError{Kind: p.Kind, After: p.Timeout}
		}
	}
	return a, err
}

// TimeoutError is a check that got no (full) answer within its timeout.
type TimeoutError struct {
	Kind  CheckKind
	After time.Duration
}

func (e *TimeoutError) Error() string {
	return string(e.Kind) + " check timed out after " + e.After.String()
}

// Timeout reports true, as net.Error's timeouts do.
func (e *TimeoutError) Timeout() bool { return true }

func (p *Probe) check(ctx context.Context) (Answer, error) {
	switch {
	case p.Kind == CheckPgSQL && (p.roleWanted() || p.PasswordFile != "" || p.Patroni != ""):
		return p.pgsqlLogin(ctx)
	case p.Kind == CheckMySQL:
		return p.mysqlLogin(ctx)
	}
	return p.checkConn(ctx)
}

// checkConn is a check over one plain connection.
func (p *Probe) checkConn(ctx context.Context) (Answer, error) {
	tcfg, err := p.tlsConfig()
	if err != nil {
		return Answer{}, err
	}
	raw, err := p.dial(ctx, "tcp", p.Addr)
	if err != nil {
		return Answer{}, err
	}
	defer raw.Close()
	defer context.AfterFunc(ctx, func() { raw.Close() })() // a cancelled probe unblocks at once
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	if p.Kind == CheckPgSQL {
		return Answer{}, pgsql(ctx, raw.(*net.TCPConn), p.Addr, p.User, p.Database, tcfg)
	}
	c := raw
	if tcfg != nil { // pgsql asks for TLS in its own protocol first
		tc, err := handshake(ctx, raw, tcfg, p.Addr)
		if err != nil {
			return Answer{}, err
		}
		defer tc.Close() // close_notify before the socket closes
		c = tc
	}
	switch p.Kind {
	case CheckTCP:
		return Answer{}, nil
	case CheckSendExpect:
		return Answer{}, sendExpect(c, p.Send, p.Expect)
	case CheckRedis:
		return p.redis(ctx, c)
	case CheckHTTP:
		return Answer{}, httpStatus(c, p.Addr, p.Path, p.Status)
	}
	return Answer{}, fmt.Errorf("unknown check %q", p.Kind)
}

// sendExpect writes send, then reads until the answer matches expect.
func sendExpect(c net.Conn, send []byte, expect *regexp.Regexp) error {
	if len(send) > 0 {
		if _, err := c.Write(send); err != nil {
			return err
		}
	}
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < 64<<10 {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if expect.Match(got) {
			return nil
		}
		if err != nil {
			if len(got) == 0 {
				return fmt.Errorf("no answer: %w", err)
			}
			return fmt.Errorf("answer %q does not match %q: %w", clip(got), expect, err)
		}
	}
	return fmt.Errorf("answer does not match %q in 64 KiB", expect)
}

// pgsql asks the way a client starts, without credentials: an SSLRequest
// (and TLS if the server offers it), then a startup packet. A PostgreSQL
// server that can take connections answers with an authentication request
// ('R') or, for a user it will not let in, an error of class 28
// (authorization) — both prove it is up. An error of class 57P (shutting
// down, starting up, in recovery and not accepting) or 53 (out of
// resources) means down.
//
// It leaves the way a client does, so that the server logs nothing: asked
// for a password, it half-closes (PostgreSQL ends such a session without a
// log line); let in (trust), it waits for ReadyForQuery and sends
// Terminate. Either way it reads to EOF before closing, so no unread byte
// turns the close into a reset ("could not receive data from client").
//
// With tcfg (tls = true) the server must take TLS and its certificate must
// verify for addr (the probe's address).
func pgsql(ctx context.Context, c *net.TCPConn, addr, user, database string, tcfg *tls.Config) error {
	if user == "" {
		user = "fulcrum"
	}
	if database == "" {
		database = "postgres"
	}
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil { // SSLRequest 80877103
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("no answer to SSLRequest: %w", err)
	}
	if b[0] != 'N' && b[0] != 'S' {
		return fmt.Errorf("answer to SSLRequest is %q, not a PostgreSQL server", b[0])
	}
	if b[0] == 'N' && tcfg != nil {
		return fmt.Errorf("postgresql refuses TLS (ssl = off), and tls = true wants it")
	}
	var rw io.ReadWriter = c
	closeWrite := c.CloseWrite
	if b[0] == 'S' {
		// Without tls = true a liveness probe sends no secret, so it need
		// not verify the certificate; it speaks TLS only so that the
		// server sees a client.
		if tcfg == nil {
			tcfg = &tls.Config{InsecureSkipVerify: true}
		}
		tc, err := handshake(ctx, c, tcfg, addr)
		if err != nil {
			return err
		}
		rw = tc
		closeWrite = func() error { tc.CloseWrite(); return c.CloseWrite() }
	}
	params := "user\x00" + user + "\x00database\x00" + database + "\x00application_name\x00fulcrum-health\x00\x00"
	pkt := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	pkt = binary.BigEndian.AppendUint32(pkt, 3<<16) // protocol 3.0
	pkt = append(pkt, params...)
	if _, err := rw.Write(pkt); err != nil {
		return err
	}
	// leave ends the session the way the server expects, then waits for
	// its close.
	leave := func(terminate bool) {
		if terminate {
			rw.Write([]byte{'X', 0, 0, 0, 4}) // Terminate; the server closes without a word
		}
		closeWrite()
		io.Copy(io.Discard, io.LimitReader(rw, 64<<10)) // to EOF or the probe's deadline
	}
	var hdr [5]byte
	for range 64 { // AuthenticationOk, a dozen ParameterStatus, BackendKeyData, ReadyForQuery
		if _, err := io.ReadFull(rw, hdr[:]); err != nil {
			return fmt.Errorf("no answer to the startup packet: %w", err)
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 8192 {
			return fmt.Errorf("malformed message %q from the server", hdr[0])
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(rw, body); err != nil {
			return err
		}
		switch hdr[0] {
		case 'R':
			if n >= 4 && binary.BigEndian.Uint32(body) == 0 {
				continue // AuthenticationOk: trust let us in; wait for ReadyForQuery
			}
			leave(false) // asked for a password: up, and a client that leaves now is not logged
			return nil
		case 'S', 'K', 'N': // ParameterStatus, BackendKeyData, NoticeResponse
			continue
		case 'Z':
			leave(true)
			return nil
		case 'E':
			leave(false)
			code, msg := pgError(body)
			if strings.HasPrefix(code, "57P") || strings.HasPrefix(code, "53") {
				return fmt.Errorf("postgresql %s: %s", code, msg)
			}
			return nil // e.g. 28000 no pg_hba.conf entry: the server is up
		default:
			return fmt.Errorf("unexpected answer %q to the startup packet", hdr[0])
		}
	}
	return fmt.Errorf("no ReadyForQuery after 64 messages")
}

// pgError reads the SQLSTATE ('C') and message ('M') fields of an ErrorResponse.
func pgError(body []byte) (code, msg string) {
	for len(body) > 1 {
		t := body[0]
		end := bytes.IndexByte(body[1:], 0)
		if end < 0 {
			break
		}
		v := string(body[1 : 1+end])
		switch t {
		case 'C':
			code = v
		case 'M':
			msg = v
		}
		body = body[2+end:]
	}
	return code, msg
}

// httpStatus sends GET path and compares the status, as Patroni's REST API
// is checked (/primary, /replica).
func httpStatus(c net.Conn, host, path string, want int) error {
	if path == "" {
		path = "/"
	}
	if want == 0 {
		want = http.StatusOK
	}
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: fulcrum-health\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("no HTTP answer: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("GET %s: status %d, want %d", path, resp.StatusCode, want)
	}
	return nil
}

func clip(b []byte) string {
	if len(b) > 80 {
		b = b[:80]
	}
	return string(b)
}
