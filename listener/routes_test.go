package listener

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/listener/listenertest"
	"fulcrum/sched"
)

// routeProxy is the routing step alone, for tests of it with real clients:
// accept, route, dial the chosen service's one backend, toBackend, then
// copy both ways. Refusals are counted by reason.
type routeProxy struct {
	addr    string
	mu      sync.Mutex // protects refused
	refused map[string]int
}

func startRouteProxy(t *testing.T, rs *sched.Routes, backends map[*sched.Service]string) *routeProxy {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &routeProxy{addr: ln.Addr().String(), refused: map[string]int{}}
	var wg sync.WaitGroup
	var mu sync.Mutex // protects conns
	conns := map[*net.TCPConn]bool{}
	track := func(c *net.TCPConn) {
		mu.Lock()
		conns[c] = true
		mu.Unlock()
	}
	wg.Add(1)
	go func() { // exits when the cleanup closes ln
		defer wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() { // exits when both copies have ended
				defer wg.Done()
				defer c.Close()
				svc, h, err := route(c, rs)
				if err == nil {
					var bc net.Conn
					if bc, err = net.Dial("tcp", backends[svc]); err == nil {
						defer bc.Close()
						track(bc.(*net.TCPConn))
						if err = toBackend(bc.(*net.TCPConn), h, svc); err == nil {
							done := make(chan struct{})
							go func() { // exits at the client's EOF or an error
								io.Copy(bc, c)
								bc.(*net.TCPConn).CloseWrite()
								close(done)
							}()
							io.Copy(c, bc)
							c.CloseWrite()
							<-done
							return
						}
					}
				}
				var pe *PrereadError
				reason := "dial"
				if errors.As(err, &pe) {
					reason = pe.Reason
				}
				p.mu.Lock()
				p.refused[reason]++
				p.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *routeProxy) refusals(reason string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[reason]
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
func TestRouteRealClients(t *testing.T) {
	needTool(t, "curl")
	needTool(t, "openssl")
	listenertest.CheckLeaks(t)
	ca := listenertest.NewCA(t)
	db1 := listenertest.NewTLSServer(t, ca, "db1", "db1.example.com")
	tenants := listenertest.NewTLSServer(t, ca, "tenants", "*.tenants.example.com")
	web2 := listenertest.NewTLSServer(t, ca, "web2", "app.example.com")
	web1 := listenertest.NewTLSServer(t, ca, "web1", "app.example.com")
	def := listenertest.NewTLSServer(t, ca, "default", "default.example.com")
	svc := map[string]*sched.Service{}
	backends := map[*sched.Service]string{}
	for _, s := range []*listenertest.TLSServer{db1, tenants, web2, web1, def} {
		svc[s.Name] = &sched.Service{Name: s.Name, ConnectTimeout: 5 * time.Second}
		backends[svc[s.Name]] = s.Addr
	}
	routes := []sched.Route{
		{Service: svc["db1"], Names: []string{"db1.example.com"}},
		{Service: svc["tenants"], Names: []string{"*.tenants.example.com"}},
		{Service: svc["web2"], Names: []string{"app.example.com"}, ALPN: []string{"h2"}},
		{Service: svc["web1"], Names: []string{"app.example.com"}, ALPN: []string{"http/1.1"}},
	}
	withDefault, err := sched.NewRoutes(append(routes, sched.Route{Service: svc["default"], Names: []string{"*"}}))
	if err != nil {
		t.Fatal(err)
	}
	noDefault, err := sched.NewRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	p := startRouteProxy(t, withDefault, backends)
	q := startRouteProxy(t, noDefault, backends)
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
		}
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
}

// TestRoutePostgres: two PostgreSQL clusters with ssl = on and their own
// certificates behind one port. psql with sslmode=verify-full reaches each
// by its host name (libpq sends SNI after the SSLRequest fulcrum answers);
// sslmode=disable, and a client naming no host, reach the default.
func TestRoutePostgres(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts two PostgreSQL clusters")
	}
	listenertest.CheckLeaks(t)
	ca := listenertest.NewCA(t)
	pg1, pg2 := listenertest.StartPostgres(t), listenertest.StartPostgres(t)
	pg1.EnableTLS(t, "db1", ca.Issue(t, "db1.example.com"))
	pg2.EnableTLS(t, "db2", ca.Issue(t, "db2.example.com"))
	db1 := &sched.Service{Name: "db1", ConnectTimeout: 5 * time.Second}
	db2 := &sched.Service{Name: "db2", ConnectTimeout: 5 * time.Second}
	rs, err := sched.NewRoutes([]sched.Route{
		{Service: db1, Names: []string{"db1.example.com"}},
		{Service: db2, Names: []string{"db2.example.com", "*"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := startRouteProxy(t, rs, map[*sched.Service]string{db1: pg1.Addr, db2: pg2.Addr})
	port := p.addr[strings.LastIndexByte(p.addr, ':')+1:]
	psql := pg1.Bin("psql")
	for _, tc := range []struct{ conn, want string }{
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db1 t"},
		{"host=DB2.example.com hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=" + ca.File, "db2 t"},
		{"host=db1.example.com hostaddr=127.0.0.1 sslmode=disable", "db2 f"},
		{"host=127.0.0.1 sslmode=require", "db2 t"}, // no SNI for an address
	} {
		conn := tc.conn + " port=" + port + " user=postgres dbname=postgres gssencmode=disable connect_timeout=20"
		out, err := runClient(t, psql, "-XAt", "-F", " ", "-d", conn, "-c", "select current_setting('cluster_name'), ssl from pg_stat_ssl where pid = pg_backend_pid()")
		if err != nil || strings.TrimSpace(out) != tc.want {
			t.Errorf("psql %q = %q, %v; want %q", tc.conn, out, err, tc.want)
		}
	}
}
