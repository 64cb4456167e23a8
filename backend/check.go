package backend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// Probe is one active health check: how to ask a backend whether it is up.
// The zero value is not usable; Kind is required.
type Probe struct {
	Kind    string        // tcp | send-expect | pgsql | redis | mysql | http
	Addr    string        // host:port to probe: the backend's, or the configured check address/port
	Timeout time.Duration // for the whole probe: connect, send and answer

	Send   []byte         // send-expect: bytes to send first (may be empty)
	Expect *regexp.Regexp // send-expect: the answer must match within Timeout

	Path   string // http: request path; default "/"
	Status int    // http: expected status; default 200

	User string // pgsql: user name in the startup packet; default "fulcrum"
}

// Run performs the probe once. A nil error means up; an error says why not.
func (p *Probe) Run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // a cancelled probe unblocks at once
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	switch p.Kind {
	case "tcp":
		return nil
	case "send-expect":
		return sendExpect(c, p.Send, p.Expect)
	case "pgsql":
		return pgsql(c, p.User)
	case "redis":
		return redisPing(c)
	case "mysql":
		return mysqlGreeting(c)
	case "http":
		return httpStatus(c, p.Addr, p.Path, p.Status)
	}
	return fmt.Errorf("unknown check %q", p.Kind)
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

// pgsql asks the way a client starts: an SSLRequest, then a startup packet.
// A PostgreSQL server that can take connections answers the startup packet
// with an authentication request ('R') or, for a user it will not let in,
// an error of class 28 (authorization) — both prove it is up. An error of
// class 57P (shutting down, starting up, in recovery and not accepting) or
// 53 (out of resources) means down.
func pgsql(c net.Conn, user string) error {
	if user == "" {
		user = "fulcrum"
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
	if b[0] == 'S' {
		return nil // it speaks PostgreSQL and wants TLS next; that is as far as a plain probe goes
	}
	params := "user\x00" + user + "\x00database\x00postgres\x00application_name\x00fulcrum-health\x00\x00"
	pkt := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	pkt = binary.BigEndian.AppendUint32(pkt, 3<<16) // protocol 3.0
	pkt = append(pkt, params...)
	if _, err := c.Write(pkt); err != nil {
		return err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("no answer to the startup packet: %w", err)
	}
	switch hdr[0] {
	case 'R':
		return nil
	case 'E':
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 8192 {
			return fmt.Errorf("malformed error message")
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(c, body); err != nil {
			return err
		}
		code, msg := pgError(body)
		if strings.HasPrefix(code, "57P") || strings.HasPrefix(code, "53") {
			return fmt.Errorf("postgresql %s: %s", code, msg)
		}
		return nil // e.g. 28000 no pg_hba.conf entry: the server is up
	}
	return fmt.Errorf("unexpected answer %q to the startup packet", hdr[0])
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

// redisPing sends PING. +PONG is up, and so is -NOAUTH (a live Redis that
// wants a password); -LOADING and other errors are down.
func redisPing(c net.Conn) error {
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReaderSize(c, 256).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer to PING: %w", err)
	}
	line = strings.TrimSpace(line)
	if line == "+PONG" || strings.HasPrefix(line, "-NOAUTH") {
		return nil
	}
	return fmt.Errorf("redis answered %q", clip([]byte(line)))
}

// mysqlGreeting reads the server's first packet: protocol 10 is a MySQL or
// MariaDB server ready for a login; an error packet (0xff: too many
// connections, host blocked) is down.
func mysqlGreeting(c net.Conn) error {
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("no greeting: %w", err)
	}
	n := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
	if n < 1 || n > 1<<16 {
		return fmt.Errorf("malformed greeting")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	switch body[0] {
	case 10:
		return nil
	case 0xff:
		msg := ""
		if len(body) > 3 {
			msg = string(body[3:])
		}
		return fmt.Errorf("mysql refused: %s", clip([]byte(msg)))
	}
	return fmt.Errorf("greeting protocol %d, not MySQL", body[0])
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
