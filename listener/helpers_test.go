package listener

import (
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

// testProxy is a listener.Server on 127.0.0.1:0 serving one service.
type testProxy struct {
	srv  *Server
	addr string
	logs *testkit.LogSink
	svc  *sched.Service
	pol  *Policy
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
	p := &testProxy{logs: testkit.NewLogSink()}
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
	key := netip.MustParseAddrPort("127.0.0.1:0")
	p.srv = New(zerolog.New(p.logs).Level(level))
	p.store(sched.NewTable(1, []*sched.Service{p.svc}, map[netip.AddrPort]*sched.Service{key: p.svc}))
	for _, o := range opts {
		o(p.srv)
	}
	ch, err := p.srv.Prepare([]netip.AddrPort{key}, false)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	p.addr = p.srv.Addr(key).String()
	t.Cleanup(func() {
		p.srv.Close()
		for _, tg := range p.svc.Targets { // close whatever is still open
			ctx, cancel := contextDone()
			tg.B.Drain(ctx)
			cancel()
		}
		p.srv.Wait()
	})
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

// until polls cond until it holds or d has passed, and says which.
func until(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// settle awaits the end of every session: no slot held, nothing active on
// the backends, no pipe lent; then Close and Wait must return.
func (p *testProxy) settle(t *testing.T, open int) {
	t.Helper()
	ok := until(10*time.Second, func() bool {
		return p.srv.Conns() == open && p.svc.Targets[0].B.Stats().Active == int64(open) &&
			p.srv.pipes.open.Load() == int64(p.srv.pipes.idleCount())
	})
	if !ok {
		t.Errorf("after 10 s: %d slots held, %d active, %d pipes open (%d idle); want %d, %d, none lent",
			p.srv.Conns(), p.svc.Targets[0].B.Stats().Active, p.srv.pipes.open.Load(), p.srv.pipes.idleCount(), open, open)
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
