package listener

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

func isAccess(m map[string]any) bool { return m["message"] == "connection" }

// testServer is a Server on one address, 127.0.0.1:0, that the test's
// cleanup stops: what every test proxy's harness (testProxy, routedProxy)
// has besides its services.
type testServer struct {
	srv  *Server
	key  netip.AddrPort // the address configured: 127.0.0.1:0
	addr string         // the address bound
	logs *testkit.LogSink
}

// start makes the Server, logging at level, publishes tbl (whose services
// are svcs) with pols, applies each opt, binds and starts accepting. When
// the test ends it closes the Server, drains every backend of svcs (which
// closes what is still open) and waits for it.
func (ts *testServer) start(t testing.TB, svcs []*sched.Service, tbl *sched.Table, pols map[string]*Policy, level zerolog.Level, opts ...func(*Server)) {
	t.Helper()
	ts.logs = testkit.NewLogSink()
	ts.srv = New(zerolog.New(ts.logs).Level(level))
	ts.srv.Publish(NewSnapshot(tbl, pols))
	for _, o := range opts {
		o(ts.srv)
	}
	ch, err := ts.srv.Prepare([]netip.AddrPort{ts.key}, false)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	ts.addr = ts.srv.Addr(ts.key).String()
	t.Cleanup(func() {
		ts.srv.Close()
		for _, svc := range svcs {
			for _, tg := range svc.Targets {
				ctx, cancel := contextDone()
				tg.B.Drain(ctx)
				cancel()
			}
		}
		ts.srv.Wait()
	})
}

// testProxy is a listener.Server on 127.0.0.1:0 serving one service.
type testProxy struct {
	testServer
	svc *sched.Service
	pol *Policy
}

// adm is the test service's admission state.
func (p *testProxy) adm() *admission { return p.srv.adm.get(p.svc.Name) }

// tuned is a test service with its policy, for a tune function to change
// either.
type tuned struct {
	*sched.Service
	*Policy
}

// store publishes table t with the test service's policy.
func (p *testProxy) store(t *sched.Table) {
	p.srv.Publish(NewSnapshot(t, map[string]*Policy{p.svc.Name: p.pol}))
}

type testBackend struct {
	name   string
	addr   string
	weight int
}

// newProxy starts a proxy for one service over the given backends and stops
// it, closing every session, when the test ends. It logs at debug level, so
// tests see every access line.
func newProxy(t *testing.T, scheduler sched.Kind, backends []testBackend, tune func(tuned), opts ...func(*Server)) *testProxy {
	t.Helper()
	return startProxy(t, scheduler, backends, tune, zerolog.DebugLevel, opts...)
}

// startProxy is newProxy with the log level given: a benchmark runs at info
// level with the access log off, as fulcrum.toml's access = false does, so
// that no log line is built per connection.
//
// Each opt is applied to the Server before it accepts.
func startProxy(t testing.TB, scheduler sched.Kind, backends []testBackend, tune func(tuned), level zerolog.Level, opts ...func(*Server)) *testProxy {
	t.Helper()
	p := &testProxy{testServer: testServer{key: netip.MustParseAddrPort("127.0.0.1:0")}}
	var pool backend.Pool
	targets := make([]sched.Target, len(backends))
	for i, b := range backends {
		targets[i] = sched.Target{B: pool.Get("svc", b.name), Addr: netip.MustParseAddrPort(b.addr), Weight: b.weight, Base: b.weight}
	}
	picker, err := sched.New(scheduler, targets, nil, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.svc = &sched.Service{Name: "svc", Scheduler: scheduler, Targets: targets, Picker: picker}
	p.pol = &Policy{ConnectTimeout: 2 * time.Second, Retries: 2, AccessLog: true}
	if tune != nil {
		tune(tuned{p.svc, p.pol})
	}
	svcs := []*sched.Service{p.svc}
	tbl := sched.NewTable(1, svcs, map[netip.AddrPort]*sched.Service{p.key: p.svc})
	p.start(t, svcs, tbl, map[string]*Policy{p.svc.Name: p.pol}, level, opts...)
	return p
}

// withLoops gives the Server n event loops.
func withLoops(n int) func(*Server) { return func(s *Server) { s.nlp = n } }

// with is opts and more, in one new slice.
func with(opts []func(*Server), more ...func(*Server)) []func(*Server) {
	return append(slices.Clip(opts), more...)
}

// withMode makes every session of the Server copy in mode m.
func withMode(m copyMode) func(*Server) { return func(s *Server) { s.mode = m } }

func (p *testProxy) dial(t testing.TB) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// settle awaits the end of every session: no slot held, nothing active on
// the backends, no pipe lent; then Close and Wait must return.
func (p *testProxy) settle(t *testing.T, open int) {
	t.Helper()
	err := testkit.Until(10*time.Second, func() error {
		conns, active, pipes, idle := p.srv.Conns(), p.svc.Targets[0].B.Stats().Active, p.srv.pipes.open.Load(), p.srv.pipes.idleCount()
		if conns != open || active != int64(open) || pipes != int64(idle) {
			return fmt.Errorf("%d slots held, %d active, %d pipes open (%d idle); want %d, %d, none lent", conns, active, pipes, idle, open, open)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// waitReturns closes the Server and awaits Wait, bounded.
func (p *testProxy) waitReturns(t *testing.T) {
	t.Helper()
	p.srv.Close()
	done := make(chan struct{})
	go func() { p.srv.Wait(); close(done) }() // exits when Wait returns
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Server.Wait did not return within 10 s")
	}
}
