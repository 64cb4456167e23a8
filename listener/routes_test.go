package listener

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/internal/wire"
	"fulcrum/sched"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"
)

// routedProxy is a Server whose one listen address is routed by name over
// several services, each with its own backends.
type routedProxy struct {
	testServer
	svcs map[string]*sched.Service
	pols map[string]*Policy // by service name
}

// routeSpec is one service of a routedProxy.
type routeSpec struct {
	name     string
	sni      []string
	alpn     []string
	backends []string      // addresses, picked round robin
	preread  time.Duration // 0: 5s
	tune     func(tuned)
}

// startRouted starts a routedProxy at the given log level and stops it,
// closing every session, when the test ends. Each opt is applied to the
// Server before it accepts.
func startRouted(t testing.TB, level zerolog.Level, specs []routeSpec, opts ...func(*Server)) *routedProxy {
	t.Helper()
	p := &routedProxy{testServer: testServer{key: netip.MustParseAddrPort("127.0.0.1:0")}, svcs: map[string]*sched.Service{}, pols: map[string]*Policy{}}
	var pool backend.Pool
	var services []*sched.Service
	var routes []sched.Route
	for _, sp := range specs {
		targets := make([]sched.Target, len(sp.backends))
		for i, a := range sp.backends {
			targets[i] = sched.Target{B: pool.Get(sp.name, fmt.Sprint(i)), Addr: netip.MustParseAddrPort(a), Weight: 1, Base: 1}
		}
		picker, err := sched.New("rr", targets, nil, sched.Options{})
		if err != nil {
			t.Fatal(err)
		}
		svc := &sched.Service{Name: sp.name, Scheduler: "rr", Targets: targets, Picker: picker, Listen: []netip.AddrPort{p.key}}
		pol := &Policy{ConnectTimeout: 5 * time.Second, Retries: 2, AccessLog: true}
		if sp.tune != nil {
			sp.tune(tuned{svc, pol})
		}
		p.svcs[sp.name], p.pols[sp.name] = svc, pol
		services = append(services, svc)
		wait := sp.preread
		if wait == 0 {
			wait = 5 * time.Second
		}
		routes = append(routes, sched.Route{Service: svc, Names: sp.sni, ALPN: sp.alpn, PrereadTimeout: wait})
	}
	rs, err := sched.NewRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	tbl := sched.NewTable(1, services, map[netip.AddrPort]*sched.Service{p.key: services[0]})
	tbl.Routed = map[netip.AddrPort]*sched.Routes{p.key: rs}
	p.start(t, services, tbl, p.pols, level, opts...)
	return p
}

// refusals returns the listener's routing refusals for reason.
func (p *routedProxy) refusals(reason string) uint64 {
	for _, so := range p.srv.Sockets() {
		if so.Listen == p.key {
			return so.Refused[reason]
		}
	}
	return 0
}

// access waits for the access line of a connection to service with sni.
func (p *routedProxy) access(t *testing.T, service, sni string) map[string]any {
	t.Helper()
	return p.logs.Wait(t, 10*time.Second, fmt.Sprintf("for %s (sni %q)", service, sni), func(m map[string]any) bool {
		got, _ := m["sni"].(string)
		return isAccess(m) && m["service"] == service && got == sni
	})
}

// needTool skips a test when a client it runs is missing, but not in CI.
func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed", name)
		}
		t.Skipf("%s is not installed", name)
	}
}

func runClient(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestRouteRealClients: curl and openssl s_client reach, through one port,
// the TLS server their server name and protocols choose; the certificate
// each verifies proves the route. A client without SNI, or with an unknown
// name, reaches the default; without a default it is closed and counted.
func TestRouteRealClients(t *testing.T) { testRouteRealClients(t) }

// testRouteRealClients is TestRouteRealClients with opts applied to every Server it starts (TestLoops).
func testRouteRealClients(t *testing.T, opts ...func(*Server)) {
	needTool(t, "curl")
	needTool(t, "openssl")
	testkit.CheckLeaks(t)
	ca := testkit.NewCA(t)
	db1 := testkit.NewTLSServer(t, ca, "db1", "db1.example.com")
	tenants := testkit.NewTLSServer(t, ca, "tenants", "*.tenants.example.com")
	web2 := testkit.NewTLSServer(t, ca, "web2", "app.example.com")
	web1 := testkit.NewTLSServer(t, ca, "web1", "app.example.com")
	def := testkit.NewTLSServer(t, ca, "default", "default.example.com")
	routes := []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{db1.Addr}},
		{name: "tenants", sni: []string{"*.tenants.example.com"}, backends: []string{tenants.Addr}},
		{name: "web2", sni: []string{"app.example.com"}, alpn: []string{"h2"}, backends: []string{web2.Addr}},
		{name: "web1", sni: []string{"app.example.com"}, alpn: []string{"http/1.1"}, backends: []string{web1.Addr}},
	}
	p := startRouted(t, zerolog.DebugLevel, append(routes, routeSpec{name: "default", sni: []string{"*"}, backends: []string{def.Addr}}), opts...)
	q := startRouted(t, zerolog.DebugLevel, routes, opts...)
	port := p.addr[strings.LastIndexByte(p.addr, ':')+1:]
	qport := q.addr[strings.LastIndexByte(q.addr, ':')+1:]

	curl := func(host, port string, extra ...string) (string, error) {
		args := append([]string{"-sS", "--max-time", "20", "--cacert", ca.File,
			"--resolve", host + ":" + port + ":127.0.0.1", "https://" + host + ":" + port + "/"}, extra...)
		return runClient(t, "curl", args...)
	}
	for _, tc := range []struct {
		host  string
		extra []string
		want  string
	}{
		{"db1.example.com", nil, "db1 HTTP/2.0"},
		{"DB1.Example.COM", []string{"--http1.1"}, "db1 HTTP/1.1"},
		{"a.tenants.example.com", nil, "tenants HTTP/2.0"},
		{"app.example.com", []string{"--http2"}, "web2 HTTP/2.0"},
		{"app.example.com", []string{"--http1.1"}, "web1 HTTP/1.1"},
		{"default.example.com", nil, "default HTTP/2.0"},
		{"tenants.example.com", []string{"-k"}, "default HTTP/2.0"},
	} {
		out, err := curl(tc.host, port, tc.extra...)
		if err != nil || strings.TrimSpace(out) != tc.want {
			t.Errorf("curl https://%s %v = %q, %v; want %q", tc.host, tc.extra, out, err, tc.want)
			continue
		}
		p.access(t, strings.Fields(tc.want)[0], strings.ToLower(tc.host))
	}

	sclient := func(addr string, args ...string) (string, error) {
		return runClient(t, "openssl", append([]string{"s_client", "-connect", addr, "-CAfile", ca.File, "-verify_return_error"}, args...)...)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-servername", "db1.example.com"}, []string{"CN = db1.example.com", "Verify return code: 0"}},
		{[]string{"-servername", "x.tenants.example.com", "-alpn", "h2"}, []string{"CN = *.tenants.example.com", "ALPN protocol: h2"}},
		{[]string{"-servername", "app.example.com", "-alpn", "http/1.1"}, []string{"CN = app.example.com", "ALPN protocol: http/1.1"}},
		{[]string{"-noservername"}, []string{"CN = default.example.com"}},
	} {
		out, err := sclient(p.addr, tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("openssl s_client %v: no %q in its output (%v):\n%s", tc.args, w, err, out)
				break
			}
		}
	}

	// Without a default: the unknown name and the client without SNI are
	// closed, and counted; a known name still gets through.
	if out, err := curl("db1.example.com", qport); err != nil || !strings.HasPrefix(out, "db1 ") {
		t.Errorf("curl db1 without a default = %q, %v; want db1", out, err)
	}
	if out, err := curl("unknown.example.com", qport, "-k"); err == nil {
		t.Errorf("curl unknown.example.com without a default = %q; want a failure", out)
	}
	if out, err := sclient(q.addr, "-noservername"); err == nil || strings.Contains(out, "CN = ") {
		t.Errorf("openssl s_client -noservername without a default succeeded:\n%s", out)
	}
	if n := q.refusals(ReasonNoRoute); n != 2 {
		t.Errorf("%d connections refused for %s; want 2", n, ReasonNoRoute)
	}
	q.logs.Wait(t, 10*time.Second, "refusing the unknown name", func(m map[string]any) bool {
		return m["message"] == "connection refused" && m["reason"] == ReasonNoRoute && m["sni"] == "unknown.example.com"
	})
}

// TestRoutePostgres: two PostgreSQL clusters with ssl = on and their own
// certificates behind one port. psql with sslmode=verify-full reaches each
// by its host name (libpq sends SNI after the SSLRequest fulcrum answers);
// sslmode=disable, and a client naming no host, reach the default.
func TestRoutePostgres(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts two PostgreSQL clusters")
	}
	testkit.CheckLeaks(t)
	ca := testkit.NewCA(t)
	pg1, pg2 := testkit.StartPostgres(t), testkit.StartPostgres(t)
	pg1.EnableTLS(t, "db1", ca.Issue(t, "db1.example.com"))
	pg2.EnableTLS(t, "db2", ca.Issue(t, "db2.example.com"))
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{pg1.Addr}},
		{name: "db2", sni: []string{"db2.example.com", "*"}, backends: []string{pg2.Addr}},
	})
	port := p.addr[strings.LastIndexByte(p.addr, ':')+1:]
	psql := pg1.Bin("psql")
	for _, tc := range []struct{ conn, want, sni string }{
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db1 t", "db1.example.com"},
		{"host=DB2.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db2 t", "db2.example.com"},
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=disable", "db2 f", ""},
		{"host=127.0.0.1 sslmode=require", "db2 t", ""}, // no SNI for an address
	} {
		conn := tc.conn + " port=" + port + " user=postgres dbname=postgres gssencmode=disable connect_timeout=20"
		out, err := runClient(t, psql, "-XAt", "-F", " ", "-d", conn, "-c", "select current_setting('cluster_name'), ssl from pg_stat_ssl where pid = pg_backend_pid()")
		if err != nil || strings.TrimSpace(out) != tc.want {
			t.Errorf("psql %q = %q, %v; want %q", tc.conn, out, err, tc.want)
			continue
		}
		p.access(t, strings.Fields(tc.want)[0], tc.sni)
	}
}

// TestRouteBackendNoSSL: a backend that does not accept the SSLRequest
// fulcrum replays counts as a failed connect, and the next one serves the
// client, receiving its ClientHello untouched. With proxy_protocol, each
// backend gets its PROXY header before the SSLRequest.
func TestRouteBackendNoSSL(t *testing.T) { testRouteBackendNoSSL(t) }

// testRouteBackendNoSSL is TestRouteBackendNoSSL with opts applied to every
// Server it starts (TestRouteLoops).
func testRouteBackendNoSSL(t *testing.T, opts ...func(*Server)) {
	for _, version := range []int{0, 2} {
		t.Run(fmt.Sprintf("proxy_protocol=%d", version), func(t *testing.T) { routeBackendNoSSL(t, version, opts...) })
	}
}

func routeBackendNoSSL(t *testing.T, version int, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com"})
	pgLike := func(answer byte) func(*net.TCPConn) {
		return func(c *net.TCPConn) {
			if version > 0 {
				if _, err := proxyproto.Read(bufio.NewReaderSize(io.LimitReader(c, 28), 16)); err != nil {
					return // a v2 header over IPv4 is 28 bytes: read exactly it
				}
			}
			var req [8]byte
			if _, err := io.ReadFull(c, req[:]); err != nil || req != wire.SSLRequest {
				return
			}
			c.Write([]byte{answer})
			if answer != 'S' {
				return
			}
			got := make([]byte, len(hello))
			if _, err := io.ReadFull(c, got); err == nil && bytes.Equal(got, hello) {
				c.Write([]byte("hello received"))
			}
			io.Copy(io.Discard, testkit.User(c))
		}
	}
	no := testkit.NewServer(t, pgLike('N'))
	yes := testkit.NewServer(t, pgLike('S'))
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{{name: "db1", sni: []string{"db1.example.com"}, backends: []string{no.Addr, yes.Addr},
		tune: func(s tuned) {
			for i := range s.Targets {
				s.Targets[i].ProxyProtocol = version
			}
		}}}, opts...)

	c := dialTCP(t, p.addr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(wire.SSLRequest[:])
	var ans [1]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil || ans[0] != 'S' {
		t.Fatalf("answer to SSLRequest: %q, %v; want S", ans, err)
	}
	c.Write(hello)
	got := make([]byte, len("hello received"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello received" {
		t.Fatalf("from the backend: %q, %v; want the hello to have reached it", got, err)
	}
	c.Close()
	line := p.logs.Wait(t, 10*time.Second, "connect failed", testkit.Message("connect failed"))
	if e, _ := line["error"].(string); !strings.Contains(e, wire.ReasonNoSSL) || line["backend"] != "0" {
		t.Errorf("connect failed line = %v; want backend 0 and %s", line, wire.ReasonNoSSL)
	}
	if acc := p.access(t, "db1", "db1.example.com"); acc["backend"] != "1" {
		t.Errorf("access line = %v; want backend 1", acc)
	}
	if n := p.svcs["db1"].Targets[0].B.Stats().ConnectFails; n != 1 {
		t.Errorf("backend 0 counted %d connect failures; want 1", n)
	}
}

// TestRouteRefusals: through a Server, a client that stops inside its
// hello is closed at preread_timeout, a malformed hello at once, and a
// client that sends nothing reaches the default once the timeout passes;
// each refusal is counted on the listener by reason.
func TestRouteRefusals(t *testing.T) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com"})
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{testkit.NewServer(t, testkit.Greeter("db1")).Addr}, preread: 300 * time.Millisecond},
		{name: "default", sni: []string{"*"}, backends: []string{testkit.NewServer(t, testkit.Greeter("default")).Addr}, preread: 300 * time.Millisecond},
	})
	closedAfter := func(first []byte) (time.Duration, []byte) {
		c := dialTCP(t, p.addr)
		start := time.Now()
		c.Write(first)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		return time.Since(start), b
	}
	if d, b := closedAfter(hello[:100]); d < 250*time.Millisecond || len(b) > 0 { // the timeout runs from the accept, a little before
		t.Errorf("a client stopping inside its hello: closed after %v having read %q; want closed at 300ms, nothing read", d, b)
	}
	bad := append([]byte(nil), hello...)
	bad[recordHeader] = 2 // a ServerHello
	if d, b := closedAfter(bad); d > 5*time.Second || len(b) > 0 {
		t.Errorf("a malformed hello: closed after %v having read %q; want closed at once", d, b)
	}
	c := dialTCP(t, p.addr) // silent: a server-first client
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if greeting, err := bufio.NewReader(c).ReadString('\n'); err != nil || greeting != "default\n" {
		t.Errorf("a silent client: read %q, %v; want the default's greeting", greeting, err)
	}
	c.Close()
	if n, m := p.refusals(wire.ReasonTimeout), p.refusals(wire.ReasonMalformed); n != 1 || m != 1 {
		t.Errorf("refused %d for %s and %d for %s; want 1 and 1", n, wire.ReasonTimeout, m, wire.ReasonMalformed)
	}
}

// TestRouteProxyHeader: on a routed address, a trusted balancer's PROXY
// header is read before the ClientHello, and the client it names is the
// one the service sees.
func TestRouteProxyHeader(t *testing.T) { testRouteProxyHeader(t) }

// testRouteProxyHeader is TestRouteProxyHeader with opts applied to every Server it starts (TestLoops).
func testRouteProxyHeader(t *testing.T, opts ...func(*Server)) {
	testkit.CheckLeaks(t)
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com"})
	got := make(chan []byte, 1)
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		b := make([]byte, len(hello))
		io.ReadFull(c, b)
		got <- b
	})
	trust := func(s tuned) {
		s.AcceptProxy = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		s.ProxyTimeout = 5 * time.Second
	}
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{be.Addr}, tune: trust},
		{name: "default", sni: []string{"*"}, backends: []string{testkit.DeadAddr(t)}, tune: trust},
	}, opts...)
	h, _ := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4242}, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 443}).Format()
	c := dialTCP(t, p.addr)
	c.Write(append(h, hello...))
	select {
	case b := <-got:
		if !bytes.Equal(b, hello) {
			t.Fatalf("the backend got %x; want the hello alone", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backend got nothing")
	}
	c.Close()
	if acc := p.access(t, "db1", "db1.example.com"); acc["client"] != "192.0.2.7:4242" {
		t.Errorf("access line = %v; want client 192.0.2.7:4242", acc)
	}
}

// TestRouteLoops runs the routing tests with three event loops, whose
// sessions must find the peeked hello still waiting in the client's socket.
func TestRouteLoops(t *testing.T) {
	for _, tt := range []struct {
		name string
		f    func(*testing.T, ...func(*Server))
	}{
		{"RealClients", testRouteRealClients},
		{"BackendNoSSL", testRouteBackendNoSSL},
		{"ProxyHeader", testRouteProxyHeader},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.f(t, withLoops(3)) })
	}
}

// TestPrepareSharedAddress: services sharing an address by name list it
// each; it is bound once.
func TestPrepareSharedAddress(t *testing.T) {
	testkit.CheckLeaks(t)
	srv := New(zerolog.Nop())
	srv.Publish(NewSnapshot(sched.NewTable(1, nil, nil), nil)) // as Commit requires: no service takes a yet
	a := netip.MustParseAddrPort("127.0.0.1:0")
	ch, err := srv.Prepare([]netip.AddrPort{a, a, a}, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ch.opened); n != 1 {
		ch.abort()
		t.Fatalf("%d sockets bound for one address listed three times; want 1", n)
	}
	ch.Commit()
	srv.Close()
	srv.Wait()
}

// TestPrepareWildcardMove: a reload that moves a port from a specific
// address to the wildcard is refused with the reason and the remedy (issue
// 30: a restart; closing the old socket first would reset the handshakes
// in its backlog), and the running listener keeps accepting.
func TestPrepareWildcardMove(t *testing.T) {
	testkit.CheckLeaks(t)
	srv := New(zerolog.Nop())
	srv.Publish(NewSnapshot(sched.NewTable(1, nil, nil), nil))
	defer srv.Wait()
	defer srv.Close()
	var a netip.AddrPort
	for port := 21700; ; port++ { // a fixed port (its number is in the error), below 32768
		if port == 21800 {
			t.Fatal("no free port in 21700–21799")
		}
		a = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
		ch, err := srv.Prepare([]netip.AddrPort{a}, false)
		if err == nil {
			ch.Commit()
			break
		}
	}
	wild := netip.AddrPortFrom(netip.IPv4Unspecified(), a.Port())
	ch, err := srv.Prepare([]netip.AddrPort{wild}, false)
	if err == nil {
		ch.abort()
		t.Fatalf("Prepare(%v) with %v listening succeeded; want EADDRINUSE", wild, a)
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "own listener "+a.String()) ||
		!strings.Contains(err.Error(), "takes a restart") {
		t.Errorf("Prepare(%v) = %v; want EADDRINUSE naming %v and the restart", wild, err, a)
	}
	c, err := net.DialTimeout("tcp", a.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("the running listener after the refused move: %v", err)
	}
	c.Close()
}

// TestRoutePerService: the access lists applied are the matched service's,
// and its counters count the refusal.
func TestRoutePerService(t *testing.T) {
	testkit.CheckLeaks(t)
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{testkit.NewServer(t, testkit.Greeter("db1")).Addr},
			tune: func(s tuned) { s.Deny = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} }},
		{name: "default", sni: []string{"*"}, backends: []string{testkit.NewServer(t, testkit.Greeter("default")).Addr}},
	})
	greeting := func(name string) string {
		c := dialTCP(t, p.addr)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(testkit.ClientHello(t, &tls.Config{ServerName: name}))
		b, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		return b
	}
	if g := greeting("db1.example.com"); g != "" {
		t.Errorf("db1, which denies loopback, answered %q; want a close", g)
	}
	if g := greeting("other.example.com"); g != "default\n" {
		t.Errorf("the default answered %q; want its greeting", g)
	}
	if n := p.srv.adm.get("db1").stats().Rejected[RejectDenied.String()]; n != 1 {
		t.Errorf("db1 counted %d denied; want 1", n)
	}
	if n := p.srv.adm.get("default").stats().Rejected[RejectDenied.String()]; n != 0 {
		t.Errorf("the default counted %d denied; want 0", n)
	}
}

// TestRouteHold: a routed connection held for want of a backend (its
// service's hold_timeout) is served by its own service in the next table,
// not by whichever service the address names first.
func TestRouteHold(t *testing.T) {
	testkit.CheckLeaks(t)
	first := testkit.NewServer(t, testkit.Greeter("first"))
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "first", sni: []string{"a.example.com"}, backends: []string{first.Addr}},
		{name: "db1", sni: []string{"db1.example.com"}, backends: []string{testkit.DeadAddr(t)},
			tune: func(s tuned) { s.HoldTimeout = 20 * time.Second; s.Retries = 0 }},
	})
	c := dialTCP(t, p.addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write(testkit.ClientHello(t, &tls.Config{ServerName: "db1.example.com"}))
	db1 := p.svcs["db1"]
	testkit.WaitFor(t, 10*time.Second, func() error { // holding has no event to wait on
		if p.srv.adm.get("db1").stats().Holding == 0 {
			return errors.New("the connection was not held")
		}
		return nil
	})

	// The next table: db1 has a live backend now (as after a reload).
	live := testkit.NewServer(t, testkit.Greeter("db1"))
	next := *db1
	next.Targets = []sched.Target{{B: db1.Targets[0].B, Addr: netip.MustParseAddrPort(live.Addr), Weight: 1, Base: 1}}
	picker, err := sched.New("rr", next.Targets, nil, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	next.Picker = picker
	old := p.srv.Snapshot()
	rs, err := sched.NewRoutes([]sched.Route{
		{Service: p.svcs["first"], Names: []string{"a.example.com"}},
		{Service: &next, Names: []string{"db1.example.com"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tbl := sched.NewTable(old.Gen+1, []*sched.Service{p.svcs["first"], &next}, map[netip.AddrPort]*sched.Service{p.key: p.svcs["first"]})
	tbl.Routed = map[netip.AddrPort]*sched.Routes{p.key: rs}
	p.srv.Publish(NewSnapshot(tbl, p.pols)) // wakes it: nothing else does (issue 27)

	if g, err := bufio.NewReader(c).ReadString('\n'); err != nil || g != "db1\n" {
		t.Errorf("the held connection read %q, %v; want db1's greeting", g, err)
	}
}

// TestRouteRemovedMidHello (issue 30): a reload removes the route a
// client's server name takes while its hello is still arriving, and the
// removed service's backend drains. The client is routed by the current
// table (to the default), not reset for want of a backend.
func TestRouteRemovedMidHello(t *testing.T) {
	testkit.CheckLeaks(t)
	dflt := testkit.NewServer(t, testkit.Greeter("dflt"))
	x := testkit.NewServer(t, testkit.Greeter("x"))
	p := startRouted(t, zerolog.DebugLevel, []routeSpec{
		{name: "dflt", sni: []string{sched.DefaultName}, backends: []string{dflt.Addr}},
		{name: "x", sni: []string{"x.example.com"}, backends: []string{x.Addr}},
	})
	c := dialTCP(t, p.addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	hello := testkit.ClientHello(t, &tls.Config{ServerName: "x.example.com"})
	c.Write(hello[:5]) // the record header: the preread waits for the rest
	testkit.WaitFor(t, 10*time.Second, func() error {
		if p.srv.Conns() == 0 {
			return errors.New("the connection was not accepted")
		}
		return nil
	})
	// The next table: x is gone, its backend drains.
	old := p.srv.Snapshot()
	rs, err := sched.NewRoutes([]sched.Route{{Service: p.svcs["dflt"], Names: []string{sched.DefaultName}, PrereadTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	tbl := sched.NewTable(old.Gen+1, []*sched.Service{p.svcs["dflt"]}, map[netip.AddrPort]*sched.Service{p.key: p.svcs["dflt"]})
	tbl.Routed = map[netip.AddrPort]*sched.Routes{p.key: rs}
	p.srv.Publish(NewSnapshot(tbl, p.pols))
	ctx, cancel := contextDone()
	p.svcs["x"].Targets[0].B.Drain(ctx) // nothing tracked: marks it draining and returns
	cancel()
	c.Write(hello[5:])
	if g, err := bufio.NewReader(c).ReadString('\n'); err != nil || g != "dflt\n" {
		t.Errorf("the client read %q, %v; want the default's greeting (routed by the current table)", g, err)
	}
}
