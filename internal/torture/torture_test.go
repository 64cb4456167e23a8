package torture

// TestTorture is the harness of issue 24: "a torture harness that would
// have found all of the above". What it does, in one process:
//
//   - a configuration file in a temporary directory, run by reload.Manager
//     on a listener.Server as main runs them, with services of every kind:
//     plain; PROXY headers both ways (accept_proxy, proxy_protocol = "v2");
//     two services routed by SNI on one address; server-speaks-first
//     backends; idle and half-close timers; one whose backends are Cut in a
//     loop; one whose listener reloads add and remove;
//   - connections with seeded lifecycles (plan_test.go): 1 B to tens of
//     MiB each way at once, half-close in both orders, resets from either
//     side, slow and stalled readers on both sides, tiny writes, urgent
//     bytes, PROXY v1 and v2;
//   - meanwhile: Backend.Cut, backends killed (every connection reset) and
//     restarted with on_down = "close" checks, operator drains, reloads
//     (the file rewritten as editors do: a temporary file renamed) adding
//     and removing backends and a listener, and hand-overs of every
//     listening socket to a second Server (Export, Adopt), the first then
//     draining, as `fulcrum upgrade` does between two processes;
//   - every stream is a function of its connection's id (stream_test.go),
//     checked byte by byte and checksummed at both ends. Allowed outcomes:
//     byte-exact delivery both ways, or an end the harness caused (a reset
//     it planned, a Cut, kill or removal of that backend, a timer it
//     provoked); a byte of one connection on another is reported as
//     FOREIGN BYTES, apart from any other failure;
//   - at the end: no connection left on any side, Server.Conns, every
//     backend's and service's counters at 0, Run (Shutdown, Server.Wait)
//     back within a bound, exactly one access line per connection, the
//     descriptors (pipes counted apart) and goroutines back to where they
//     were.
//
// Reproduce: the seed is printed; FULCRUM_TORTURE_SEED=<seed> replays the
// same plans and fault schedule (the interleaving is the machine's).
// FULCRUM_TORTURE=<duration> runs that long instead of the short run, with
// more connections at once (FULCRUM_TORTURE_CONNS sets how many).
// Strict (datapathFixed, or FULCRUM_TORTURE_STRICT=1) also fails on
// failures that bear only the marks of the known defects (knownDefect:
// issue 24's C1, C2 and C4, fixed on another branch); otherwise they are
// logged as KNOWN, and a -race run leaves the cut storm out.
// FULCRUM_TORTURE_ONLY=svc,... and FULCRUM_TORTURE_CHAOS=0 narrow a run
// down while debugging.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
	"fulcrum/reload"
)

// Failure classes, worst first.
const (
	classForeign   = "FOREIGN BYTES (a byte of one connection on another)"
	classCorrupt   = "corrupt stream"
	classDuplicate = "stream delivered twice"
	classMisrouted = "misrouted"
	classStalled   = "stalled (no byte for the stall limit)"
	classTruncated = "truncated without cause (a clean FIN, bytes missing)"
	classUrgent    = "stalled, truncated or reset after an urgent byte (MSG_OOB)"
	classReset     = "reset without cause"
	classRefused   = "refused on a stable listener"
	classStopping  = "refused by a stopping instance (accepted before its listeners closed, then no backend)"
	classAccess    = "access lines"
	classStuck     = "connection never ended"
	classGauge     = "gauge not back to zero"
	classWait      = "Run/Server.Wait did not return"
	classFD        = "descriptors not back to baseline"
	classLeak      = "goroutines left"
	classHarness   = "harness"
)

var classOrder = []string{classForeign, classCorrupt, classDuplicate, classMisrouted, classUrgent, classStalled, classTruncated,
	classReset, classRefused, classStopping, classAccess, classStuck, classGauge, classWait, classFD, classLeak, classHarness}

// datapathFixed says that issue 24's data-path fixes are in, as they are
// since main's 59e84c0 (Merge branch 'datapath'): every failure fails the
// test, and -race runs have the cut storm. FULCRUM_TORTURE_STRICT=0 (or 1)
// decides instead when set: 0 runs the harness against older code, where it
// logs what bears only the known defects' marks (knownDefect) as KNOWN.
const datapathFixed = true

// Known defects. The harness found these on main at a11a213, and another
// branch fixes them (issue 24); until that has landed, a failure that bears
// only their marks is logged as KNOWN and does not fail the test, unless
// strict (datapathFixed, FULCRUM_TORTURE_STRICT=1). Any other failure in
// the same class fails it.
//   - C4, urgent data: every stream with an urgent byte that stalled, was
//     truncated or reset.
//   - C1, a session finished twice: a second access line whose error is the
//     failed registration of the backend socket (EBADF, ENOENT), the
//     goroutine that second finish leaves in connDone, an accept loop
//     blocked giving back its slot (markC1); once one is seen, what C1
//     breaks elsewhere (c1Classes) is known too.
//   - C2, a Cut between Track and begin: streams of the cut service that
//     never move, and what they hold at the end (counters, Run's return).
func knownDefect(class, msg string, c2, c1 bool) bool {
	if c1 && c1Classes[class] {
		return true
	}
	switch class {
	case classUrgent:
		return true
	case classAccess:
		return strings.Contains(msg, ": 2 access lines: ") &&
			(strings.Contains(msg, `error="bad file descriptor"`) || strings.Contains(msg, `error="no such file or directory"`))
	case classLeak:
		return strings.Contains(msg, "listener.(*Server).connDone") && strings.Count(msg, "[Goroutine ") == strings.Count(msg, "connDone on top of the stack")
	case classStalled, classStuck:
		return c2
	case classGauge, classWait: // what stays held is the cut service's alone
		held := heldRE.FindAllStringSubmatch(msg, -1)
		cutOnly := len(held) > 0
		for _, m := range held {
			cutOnly = cutOnly && m[1] == "cut"
		}
		return c2 || cutOnly
	}
	return false
}

// c1Classes are what C1's wrong closes and counts can break anywhere once
// it has left a mark: a stream's end (its descriptor closed under it, or
// left open when another was closed in its place), the counters, Shutdown,
// the reload that waits on a retired accept loop, the access lines, the
// descriptors and goroutines. Wrong or foreign bytes are never excused.
var c1Classes = map[string]bool{classStalled: true, classTruncated: true, classReset: true, classAccess: true,
	classStuck: true, classGauge: true, classWait: true, classFD: true, classLeak: true, classHarness: true}

// heldRE finds "service/backend active N" in what an instance holds.
var heldRE = regexp.MustCompile(`([a-z0-9]+)/[a-z0-9]+ active [0-9]+`)

// service is one service of the generated configuration.
type service struct {
	name     string
	addr     string // its listen address
	share    int    // of new connections
	pp       bool   // clients send a PROXY header; backends get one
	tls      bool   // routed by SNI (tlsa, tlsb share an address)
	greet    bool   // backends speak first
	timed    bool   // idle and half-close timers
	dyn      bool   // reloads add and remove its listener
	backends []*tbackend
}

type window struct{ from, to time.Time }

type harness struct {
	t          *testing.T
	seed       uint64
	dir, path  string
	stallLimit time.Duration
	huge       int64 // the largest stream
	oob        bool
	idleTimeout,
	drainTimeout time.Duration

	services  []*service // those clients pick from (tlsa stands for both tls services)
	svc       map[string]*service
	all       []*service
	weightSum int
	hellos    map[string][]byte
	backends  map[string]*tbackend

	log   *sink
	cur   atomic.Pointer[instance]
	began time.Time

	mu       sync.Mutex // protects what follows
	plans    map[uint64]*plan
	cli      map[uint64]*cliResult
	be       map[uint64]*beResult
	fails    map[string][]string
	notes    []string
	disrupt  map[string][]window // backend name → when the harness (or fulcrum's on_down) ended its sessions
	handover []time.Time
	dynOff   []window
	state    cfgState
	counts   map[string]int // faults driven

	c1     bool         // a mark of C1 was seen (markC1); protected by mu
	c2     bool         // every session left open was Cut as it was admitted: C2's mark; protected by mu
	anon   atomic.Int64 // backend connections with no stream (health checks, sessions cut before a byte)
	nextID atomic.Uint64
	live   atomic.Int64 // backend connections claimed and not done
}

// cfgState is what the chaos changes in the file.
type cfgState struct {
	p3, dyn, d1 bool
	w1          int
}

type cliResult struct {
	start, end time.Time
	wrote      time.Time // its writes had all returned (then its FIN, in its order)
	downEnd    time.Time // the down stream had ended
	upMarks    []wmark   // timed service: when its writes ended (writeStream)
	dialErr    error
	upN        int64
	upCRC      uint32
	upErr      error
	downN      int64
	downCRC    uint32
	downEOF    bool
	downErr    error
	bad        *mismatch
	greetAcc   uint64
	oobInline  bool // the backend's urgent byte came in the stream
}

// instance is one Server and its Manager, as one fulcrum process has.
type instance struct {
	n      int
	srv    *listener.Server
	m      *reload.Manager
	cancel context.CancelFunc
	done   chan error
	hup    chan struct{}
	took   atomic.Int64 // nanoseconds from cancel to Run's return
}

func envDuration(t *testing.T, name string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func TestTorture(t *testing.T) {
	leakOpt := goleak.IgnoreCurrent()
	baseFDs, basePipes := countFDs(t)

	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FULCRUM_TORTURE_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FULCRUM_TORTURE_SEED=%q: %v", v, err)
		}
		seed = s
	}
	run, conc, churners := 20*time.Second, 300, 16
	huge := int64(24 << 20)
	long := envDuration(t, "FULCRUM_TORTURE")
	if long > 0 {
		run, conc, huge = long, 800, 40<<20
	}
	if testkit.RaceEnabled { // the race detector makes the harness's own checking several times dearer
		conc /= 3
		if long == 0 {
			huge = 12 << 20 // the largest streams are the short run's tail
		}
	}
	if v := os.Getenv("FULCRUM_TORTURE_CONNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FULCRUM_TORTURE_CONNS=%q: want a positive number", v)
		}
		conc = n
	}
	strict := datapathFixed
	switch os.Getenv("FULCRUM_TORTURE_STRICT") {
	case "1":
		strict = true
	case "0":
		strict = false
	}
	// C1's double finish is a data race as well, which the race detector
	// reports whatever this harness decides, and the cut storm finds it in
	// most short runs: until the fixes are in, the storm is left out of
	// -race runs that are not strict.
	storm := strict || !testkit.RaceEnabled
	t.Logf("seed %d (reproduce: FULCRUM_TORTURE_SEED=%d); driving for %v, %d connections at once; strict %v", seed, seed, run, conc, strict)

	h := &harness{t: t, seed: seed, dir: t.TempDir(), stallLimit: 30 * time.Second, huge: huge, oob: true,
		idleTimeout: 5 * time.Second, drainTimeout: 8 * time.Second,
		plans: map[uint64]*plan{}, cli: map[uint64]*cliResult{}, be: map[uint64]*beResult{},
		fails: map[string][]string{}, disrupt: map[string][]window{}, counts: map[string]int{},
		svc: map[string]*service{}, backends: map[string]*tbackend{}, hellos: map[string][]byte{}}
	h.path = filepath.Join(h.dir, "fulcrum.toml")
	h.log = &sink{h: h, access: map[string][]string{}, msgs: map[string]int{}, down: map[string]time.Time{}}
	h.setup()
	inst, err := h.start(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.cur.Store(inst)
	insts := []*instance{inst}
	var instMu sync.Mutex

	began := time.Now()
	h.began = began
	deadline := began.Add(run)
	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Add(2)
	go func() { // exits when stop is closed
		defer faults.Done()
		if !storm {
			t.Log("no cut storm: a -race run that is not strict (datapathFixed false, FULCRUM_TORTURE_STRICT unset)")
			<-stop
			return
		}
		h.cutStorm(stop)
	}()
	go func() { // exits when stop is closed
		defer faults.Done()
		if os.Getenv("FULCRUM_TORTURE_CHAOS") == "0" { // a debugging aid: no faults but the cut storm
			<-stop
			return
		}
		h.chaos(stop, deadline, func(i *instance) { instMu.Lock(); insts = append(insts, i); instMu.Unlock() })
	}()
	var clients sync.WaitGroup
	for range conc {
		clients.Add(1)
		go func() { // exits at the deadline, after its last connection
			defer clients.Done()
			for time.Now().Before(deadline) {
				h.client(h.newConn(false))
			}
		}()
	}
	for range churners {
		clients.Add(1)
		go func() { // exits at the deadline, after its last connection
			defer clients.Done()
			for time.Now().Before(deadline) {
				h.client(h.newConn(true))
			}
		}()
	}
	if !waitGroup(&clients, time.Until(deadline)+h.stallLimit+90*time.Second) {
		h.fail(classStuck, 0, "clients still running 2 minutes after the deadline")
		h.dumpGoroutines()
		h.report(time.Since(began), nil, true)
		t.FailNow()
	}
	driven := time.Since(began)
	close(stop)
	faults.Wait()
	for _, b := range h.backends { // what the chaos killed comes back: the end state is all up
		b.mu.Lock()
		down := b.ln == nil
		b.mu.Unlock()
		if down {
			b.start()
		}
	}
	// Every backend connection must end: a session fulcrum left open would
	// keep one forever.
	if !poll(30*time.Second, func() bool { return h.live.Load() == 0 }) {
		h.mu.Lock()
		var open []string
		cutAtStart := true // C2's mark: each was Cut (or its backend went down) as it was admitted
		for id, r := range h.be {
			if r.end.IsZero() {
				p, cr := h.plans[id], h.cli[id]
				near := false
				for _, w := range h.disrupt[r.backend] {
					near = near || !w.from.After(r.start.Add(time.Second)) && !w.to.Before(cr.start.Add(-time.Second))
				}
				cutAtStart = cutAtStart && (near || p.svc.name == "cut")
				open = append(open, fmt.Sprintf("%d (%s, %s; Cut or down as it was admitted: %v; the client: sent %d/%d %v, got %d/%d eof %v %v)",
					id, p.svc.name, r.backend, near, cr.upN, p.up, cr.upErr, cr.downN, p.down, cr.downEOF, cr.downErr))
			}
		}
		if cutAtStart && len(open) > 0 {
			h.c2 = true
			h.notes = append(h.notes, "C2 (a Cut between Track and begin wedges the session): every session left open was Cut, or its backend went down, as it was admitted")
		}
		h.mu.Unlock()
		sort.Strings(open)
		h.fail(classStuck, 0, fmt.Sprintf("%d backend connections still open 30s after every client ended: %s", len(open), head(open, 20)))
	}
	h.log.flush()
	h.judge()
	h.checkGauges(insts)
	// Shut down as main does at SIGTERM: Run's Shutdown, then Server.Wait.
	waited := true
	for _, in := range insts {
		if in.took.Load() == 0 {
			in.stop(h)
		}
		select {
		case <-in.waitDone():
		case <-time.After(h.drainTimeout + 30*time.Second):
			h.fail(classWait, 0, fmt.Sprintf("instance %d: Run did not return within %v of its cancel (Shutdown waits in Server.Wait for sessions that never end): %s", in.n, h.drainTimeout+30*time.Second, in.holding()))
			waited = false
		}
	}
	if !waited {
		h.dumpGoroutines()
	}
	for _, b := range h.backends {
		b.kill()
		if !waitGroup(&b.wg, 10*time.Second) {
			h.fail(classHarness, 0, "backend "+b.name+" handlers did not end")
		}
	}
	if waited {
		h.checkAccess()
		h.checkFDs(baseFDs, basePipes)
		if err := goleak.Find(leakOpt); err != nil {
			h.fail(classLeak, 0, err.Error())
			if knownDefect(classLeak, err.Error(), false, false) {
				h.markC1("a goroutine left in connDone, waiting for a slot a second finish took")
			}
		}
	} else {
		h.note("access lines, descriptors and goroutines not checked: an instance did not stop")
	}
	h.report(driven, insts, strict)
}

// setup starts the backends and writes the first configuration.
func (h *harness) setup() {
	t := h.t
	free := func() string { return testkit.FreeAddr(t) }
	add := func(s *service, names ...string) {
		h.svc[s.name] = s
		h.all = append(h.all, s)
		for _, n := range names {
			b := &tbackend{h: h, name: n, svc: s.name, addr: free(), idx: uint64(len(h.backends) + 1), greet: s.greet, pp: s.pp}
			h.backends[n] = b
			s.backends = append(s.backends, b)
		}
	}
	tlsAddr := free()
	for _, name := range []string{"a.torture.test", "b.torture.test"} {
		h.hellos[name] = clientHello(t, name)
	}
	add(&service{name: "plain", addr: free(), share: 25}, "p0", "p1", "p2", "p3")
	add(&service{name: "pp", addr: free(), share: 15, pp: true}, "q0", "q1")
	add(&service{name: "tlsa", addr: tlsAddr, share: 15, tls: true}, "ta0", "ta1")
	add(&service{name: "tlsb", addr: tlsAddr, tls: true}, "tb0", "tb1")
	add(&service{name: "greet", addr: free(), share: 10, greet: true}, "g0", "g1")
	add(&service{name: "timed", addr: free(), share: 10, timed: true}, "m0", "m1")
	add(&service{name: "cut", addr: free(), share: 5}, "c0", "c1")
	add(&service{name: "dyn", addr: free(), share: 10, dyn: true}, "d0", "d1")
	only := os.Getenv("FULCRUM_TORTURE_ONLY") // a debugging aid: clients of these services only (comma-separated)
	for _, s := range h.all {
		if only != "" && !slices.Contains(strings.Split(only, ","), s.name) {
			s.share = 0
		}
		if s.share > 0 {
			h.services = append(h.services, s)
			h.weightSum += s.share
		}
		for _, b := range s.backends {
			if s.tls {
				b.hello = h.hellos[map[string]string{"tlsa": "a.torture.test", "tlsb": "b.torture.test"}[s.name]]
			}
			if err := b.start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.state = cfgState{p3: true, dyn: true, d1: true, w1: 1}
	h.write()
	t.Cleanup(func() {
		for _, b := range h.backends {
			b.kill()
		}
	})
}

// clientHello returns the first flight of a TLS client for name.
func clientHello(t *testing.T, name string) []byte {
	var cc captureConn
	tls.Client(&cc, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
	if cc.b.Len() == 0 {
		t.Fatal("no ClientHello captured")
	}
	return bytes.Clone(cc.b.Bytes())
}

type captureConn struct{ b bytes.Buffer }

func (c *captureConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *captureConn) Write(p []byte) (int, error)      { return c.b.Write(p) }
func (c *captureConn) Close() error                     { return nil }
func (c *captureConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *captureConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }

// render is the configuration for state st.
func (h *harness) render(st cfgState) string {
	var b strings.Builder
	fmt.Fprintf(&b, `[log]
format = "json"
access = true
[reload]
debounce = "30ms"
resolve_interval = "0s"
[defaults]
retries = 2
connect_timeout = "5s"
drain_timeout = %q
on_down = "close"
proxy_timeout = "20s"
preread_timeout = "20s"
[defaults.health]
check = "tcp"
interval = "1s"
timeout = "1s"
rise = 1
fall = 3
`, h.drainTimeout.String())
	for _, s := range h.all {
		if s.dyn && !st.dyn {
			continue
		}
		fmt.Fprintf(&b, "\n[services.%s]\nlisten = [%q]\n", s.name, s.addr)
		switch {
		case s.pp:
			b.WriteString("accept_proxy = [\"127.0.0.0/8\"]\nproxy_protocol = \"v2\"\n")
		case s.name == "tlsa":
			b.WriteString("sni = [\"a.torture.test\"]\n")
		case s.name == "tlsb":
			b.WriteString("sni = [\"b.torture.test\"]\n")
		case s.timed:
			fmt.Fprintf(&b, "idle_timeout = %q\nhalf_close_timeout = %q\n", h.idleTimeout.String(), (h.idleTimeout - time.Second).String())
		}
		for _, be := range s.backends {
			if be.name == "p3" && !st.p3 || be.name == "d1" && !st.d1 {
				continue
			}
			w := 1
			if be.name == "p1" {
				w = st.w1
			}
			fmt.Fprintf(&b, "[[services.%s.backends]]\nname = %q\naddress = %q\nweight = %d\n", s.name, be.name, be.addr, w)
		}
	}
	return b.String()
}

// write replaces the file as editors do: a temporary file, renamed over it.
func (h *harness) write() {
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(h.render(h.state)), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

// start runs a Server and Manager on the file, as main does; with exp, the
// Server first adopts those sockets (a binary upgrade's new process).
func (h *harness) start(n int, exp []listener.Exported) (*instance, error) {
	cfg, err := conf.Load(h.path)
	if err != nil {
		return nil, err
	}
	in := &instance{n: n, done: make(chan error, 1), hup: make(chan struct{}, 1)}
	log := zerolog.New(h.log).With().Timestamp().Int("instance", n).Logger()
	in.srv = listener.New(log)
	for _, e := range exp {
		l, err := net.FileListener(e.File)
		e.File.Close()
		if err != nil {
			return nil, err
		}
		in.srv.Adopt(e.Key, l.(*net.TCPListener))
	}
	in.m = reload.New(h.path, in.srv, log, reload.Options{Hup: in.hup})
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() { in.done <- in.m.Run(ctx, cfg) }() // exits when stop cancels ctx, after Shutdown and Server.Wait
	if !poll(10*time.Second, func() bool { return in.m.Table() != nil }) {
		cancel()
		return nil, fmt.Errorf("the first configuration was not applied within 10s: %s", in.m.Status().LastError)
	}
	in.srv.CloseUnadopted() // as main does once it serves
	return in, nil
}

// stop cancels the instance's Run and times its return in the background:
// Shutdown drains every backend for drain_timeout, then closes what is
// left, so Run must be back soon after. If it is not, what still holds
// it is recorded.
func (in *instance) stop(h *harness) {
	t0 := time.Now()
	in.cancel()
	in.took.Store(-1)
	go func() { // exits when Run returns
		bound := h.drainTimeout + 5*time.Second
		late := time.NewTimer(bound)
		defer late.Stop()
		var err error
		select {
		case err = <-in.done:
		case <-late.C:
			h.fail(classWait, 0, fmt.Sprintf("instance %d: Run not back %v after its cancel (drain_timeout %v): %s", in.n, bound, h.drainTimeout, in.holding()))
			h.dumpGoroutines()
			err = <-in.done
		}
		in.took.Store(int64(time.Since(t0)))
		in.done <- err
	}()
}

// holding describes what an instance still holds: its connections and
// each backend's active count.
func (in *instance) holding() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Server.Conns %d", in.srv.Conns())
	if t := in.m.Table(); t != nil {
		for _, s := range t.Services {
			for _, tg := range s.All() {
				if a := tg.B.Active(); a != 0 {
					fmt.Fprintf(&b, ", %s/%s active %d", s.Name, tg.B.Name, a)
				}
			}
		}
	}
	return b.String()
}

// waitDone returns a channel closed once Run has returned after stop.
func (in *instance) waitDone() <-chan struct{} {
	c := make(chan struct{})
	go func() { // exits when Run has returned, or with the test binary
		for in.took.Load() <= 0 {
			time.Sleep(10 * time.Millisecond)
		}
		close(c)
	}()
	return c
}

// newConn makes the next connection's plan.
func (h *harness) newConn(churn bool) *plan {
	id := h.nextID.Add(1)
	p := h.newPlan(id, churn)
	h.mu.Lock()
	h.plans[id] = p
	h.mu.Unlock()
	return p
}

func (h *harness) plan(id uint64) *plan {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.plans[id]
}

// claim records that a backend got the stream of id; a second backend
// getting it is a duplicate.
func (h *harness) claim(id uint64, r *beResult) bool {
	h.mu.Lock()
	prev := h.be[id]
	if prev == nil {
		h.be[id] = r
	}
	h.mu.Unlock()
	if prev != nil {
		h.fail(classDuplicate, id, fmt.Sprintf("backend %s got the stream of connection %d, which %s had already", r.backend, id, prev.backend))
		return false
	}
	h.live.Add(1)
	return true
}

func (h *harness) beDone(id uint64, r *beResult) {
	h.mu.Lock()
	r.end = time.Now()
	h.mu.Unlock()
	h.live.Add(-1)
}

func (h *harness) fail(class string, id uint64, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if id != 0 {
		msg = fmt.Sprintf("conn %d: %s", id, msg)
	}
	h.fails[class] = append(h.fails[class], msg)
}

func (h *harness) note(msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.notes) < 100 {
		h.notes = append(h.notes, msg)
	}
}

func (h *harness) count(what string, n int) {
	h.mu.Lock()
	h.counts[what] += n
	h.mu.Unlock()
}

func (h *harness) disrupted(name string, from, to time.Time) {
	h.mu.Lock()
	h.disrupt[name] = append(h.disrupt[name], window{from, to})
	h.mu.Unlock()
}

// client plays the client's side of p.
func (h *harness) client(p *plan) {
	cr := &cliResult{start: time.Now()}
	defer func() {
		cr.end = time.Now()
		h.mu.Lock()
		h.cli[p.id] = cr
		h.mu.Unlock()
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.localIP.AsSlice()}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", p.svc.addr)
	if err != nil {
		cr.dialErr = err
		return
	}
	c := nc.(*net.TCPConn)
	defer c.Close()
	rst := &resetOnce{c: c}
	prog := p.prog
	var pre []byte
	if p.svc.pp {
		hdr := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: p.clientIP.AsSlice(), Port: 1024 + int(p.id%60000)}, c.RemoteAddr())
		if p.ppV1 {
			hdr.Version = 1
		}
		pre, _ = hdr.Format()
	}
	pre = append(pre, p.hello...)
	if len(pre) > 0 {
		c.SetWriteDeadline(time.Now().Add(p.limit))
		if _, err := c.Write(pre); err != nil {
			cr.upErr = err
			return
		}
	}
	downDone := make(chan struct{})
	go func() { // exits at the down stream's end or error: the reader
		defer close(downDone)
		r := &deadlineReader{c, p.limit, prog}
		if p.svc.greet {
			var g [greetLen]byte
			if _, err := io.ReadFull(r, g[:]); err != nil {
				cr.downErr = err
				return
			}
			acc, dir, idx, ok := parseChunk(g[:])
			if !ok || dir != dirGreet || idx != 0 {
				cr.bad = &mismatch{what: fmt.Sprintf("the greeting is no greeting: % x", g[:32])}
				rst.reset()
				return
			}
			gv := newVerifier(acc, dirGreet, -1)
			gv.write(g[:])
			if gv.bad != nil {
				cr.bad = gv.bad
				rst.reset()
				return
			}
			cr.greetAcc = acc
		}
		v := newVerifier(p.id, dirDown, p.beOOB)
		cr.downEOF, cr.downErr = readStream(r, v, p.cliSlow, p.cliStall, p.rstClientDown, rst, p.rng(2), p.svc.timed)
		cr.downEnd = time.Now()
		cr.downN, cr.downCRC, cr.oobInline = v.n, v.crc, v.oobInline
		if v.bad != nil {
			cr.bad = v.bad
		}
	}()
	var marks *[]wmark
	if p.svc.timed {
		marks = &cr.upMarks
	}
	cr.upN, cr.upCRC, cr.upErr = writeStream(c, p.id, dirUp, p.up, p.cliOOB, -1, p.tiny, rst, p.rng(5), p.limit, prog, marks)
	cr.wrote = time.Now()
	if cr.upErr == nil {
		if p.order == backendFirst {
			<-downDone
		}
		if !rst.done() {
			c.CloseWrite()
		}
	}
	<-downDone
}

// cutStorm calls Cut on the cut service's backends in a loop, as
// on_down = "close" does, until stop is closed.
func (h *harness) cutStorm(stop <-chan struct{}) {
	n := 0
	defer func() { h.count("Backend.Cut calls (cut service, in a loop)", n) }()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		t := h.cur.Load().m.Table()
		if s := t.Service("cut"); s != nil {
			for _, tg := range s.Targets {
				tg.B.Cut(backend.CutDown)
				n++
			}
		}
		if i%8 == 7 { // a few thousand Cuts a second: the storm must not take a whole P
			time.Sleep(time.Millisecond)
		} else {
			runtime.Gosched()
		}
	}
}

// chaos drives the faults until stop is closed: Cut, kill and restart,
// operator drains, reloads and hand-overs.
func (h *harness) chaos(stop <-chan struct{}, deadline time.Time, adopted func(*instance)) {
	r := rand.New(rand.NewPCG(h.seed, 0xc4a05))
	var kills sync.WaitGroup
	defer kills.Wait()
	killed := map[string]bool{}
	var killMu sync.Mutex
	began := time.Now()
	every := max(10*time.Second, (deadline.Sub(began))/3)
	nextHandover := began.Add(every)
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(50+r.IntN(250)) * time.Millisecond):
		}
		if time.Now().After(nextHandover) && time.Now().Before(deadline.Add(-3*time.Second)) {
			nextHandover = nextHandover.Add(every)
			h.handOver(adopted)
			continue
		}
		stable := []string{"plain", "pp", "tlsa", "tlsb", "greet", "timed", "dyn"}
		s := h.svc[stable[r.IntN(len(stable))]]
		b := s.backends[r.IntN(len(s.backends))]
		switch x := r.IntN(100); {
		case x < 35: // what on_down = "close" does, at a random moment
			if tb := h.cur.Load().m.Table().Service(s.name); tb != nil {
				for _, tg := range tb.All() {
					if tg.B.Name == b.name {
						now := time.Now()
						tg.B.Cut(backend.CutDown)
						h.disrupted(b.name, now, time.Now())
						h.count("Backend.Cut of a random backend", 1)
					}
				}
			}
		case x < 50: // the backend dies (every connection reset) and returns
			killMu.Lock()
			up := 0
			for _, o := range s.backends {
				if !killed[o.name] {
					up++
				}
			}
			if killed[b.name] || up < 2 {
				killMu.Unlock()
				continue
			}
			killed[b.name] = true
			killMu.Unlock()
			from := time.Now()
			b.kill()
			h.count("backend killed and restarted", 1)
			down := time.Duration(200+r.IntN(1300)) * time.Millisecond
			kills.Add(1)
			go func() { // exits once the backend listens again
				defer kills.Done()
				time.Sleep(down)
				for i := 0; b.start() != nil && i < 100; i++ {
					time.Sleep(20 * time.Millisecond)
				}
				// on_down's Cut follows the check (interval 400ms, fall 1).
				h.disrupted(b.name, from, time.Now().Add(time.Second))
				killMu.Lock()
				delete(killed, b.name)
				killMu.Unlock()
			}()
		case x < 62: // an operator drains it (sessions run on), then lets it go
			m := h.cur.Load().m
			if ok, _ := m.SetOverride(s.name, b.name, backend.Drain, "torture"); ok {
				h.count("operator drain and undrain", 1)
				time.Sleep(time.Duration(100+r.IntN(400)) * time.Millisecond)
				m.SetOverride(s.name, b.name, backend.Ready, "torture")
			}
		default: // a reload
			h.mu.Lock()
			st := h.state
			h.mu.Unlock()
			now := time.Now()
			var what string
			switch r.IntN(4) {
			case 0:
				st.p3 = !st.p3
				what = "reload: backend p3 removed or added"
				h.disrupted("p3", now, now.Add(h.drainTimeout+2*time.Second))
			case 1:
				st.dyn = !st.dyn
				what = "reload: service dyn (its listener) removed or added"
				h.mu.Lock()
				h.dynOff = append(h.dynOff, window{now.Add(-time.Second), now.Add(time.Second)})
				h.mu.Unlock()
				for _, o := range h.svc["dyn"].backends {
					h.disrupted(o.name, now, now.Add(h.drainTimeout+2*time.Second))
				}
			case 2:
				st.d1 = !st.d1
				what = "reload: backend d1 removed or added"
				h.disrupted("d1", now, now.Add(h.drainTimeout+2*time.Second))
			case 3:
				st.w1 = 1 + r.IntN(4)
				what = "reload: weight of p1 changed"
			}
			if h.render(st) == h.render(h.state) { // the same file (d1 while dyn is out): no reload to wait for
				continue
			}
			h.reload(st)
			h.count(what, 1)
		}
	}
}

// reload writes st and waits for the current instance to apply it.
func (h *harness) reload(st cfgState) {
	in := h.cur.Load()
	gen := in.m.Table().Gen
	h.mu.Lock()
	old := h.state
	h.state = st
	h.mu.Unlock()
	h.write()
	applied := func() bool { return in.m.Table().Gen > gen }
	if poll(10*time.Second, applied) {
		return
	}
	h.dumpGoroutines()
	in.hup <- struct{}{} // what systemctl reload would do
	t0 := time.Now()
	if poll(5*time.Second, applied) {
		h.note(fmt.Sprintf("instance %d: a reload from %+v to %+v was not applied within 10s of the rename, but %v after a SIGHUP (generation %d)", in.n, old, st, time.Since(t0).Round(time.Millisecond), gen))
		h.count("reloads applied only on SIGHUP", 1)
		return
	}
	h.fail(classHarness, 0, fmt.Sprintf("a reload to %+v was not applied within 15s by instance %d, SIGHUP or not (generation %d; status %+v)", st, in.n, gen, in.m.Status()))
}

// handOver gives every listening socket to a new instance, which adopts
// them, and stops the old one, which drains: `fulcrum upgrade` within one
// process.
func (h *harness) handOver(adopted func(*instance)) {
	old := h.cur.Load()
	exp, err := old.srv.Export()
	if err != nil {
		h.fail(classHarness, 0, "Export: "+err.Error())
		return
	}
	in, err := h.start(old.n+1, exp)
	if err != nil {
		h.fail(classHarness, 0, "the new instance: "+err.Error())
		return
	}
	adopted(in)
	h.cur.Store(in)
	now := time.Now()
	h.mu.Lock()
	h.handover = append(h.handover, now)
	h.mu.Unlock()
	old.stop(h)
	h.count("hand-over of the listening sockets to a new Server", 1)
}

// excused reports why p's stream may have ended early, or "".
func (h *harness) excused(p *plan, cr *cliResult, br *beResult) string {
	if p.faulty() {
		return "planned"
	}
	if p.svc.name == "cut" {
		return "cut service"
	}
	from, to := cr.start.Add(-time.Second), cr.end.Add(time.Second)
	if br != nil && br.end.After(cr.end) {
		to = br.end.Add(time.Second)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	names := []string{}
	if br != nil {
		names = append(names, br.backend)
	} else {
		for _, b := range p.svc.backends {
			names = append(names, b.name)
		}
	}
	for _, n := range names {
		for _, w := range h.disrupt[n] {
			if !w.from.After(to) && !w.to.Before(from) {
				return "backend " + n + " disrupted"
			}
		}
	}
	for _, t := range h.handover {
		if cr.start.Before(t) && cr.end.After(t.Add(h.drainTimeout-time.Second)) {
			return "drained at a hand-over"
		}
	}
	return ""
}

// judge checks every connection's outcome at both ends.
func (h *harness) judge() {
	h.mu.Lock()
	ids := make([]uint64, 0, len(h.cli))
	for id := range h.cli {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		h.mu.Lock()
		p, cr, br := h.plans[id], h.cli[id], h.be[id]
		open := br != nil && br.end.IsZero()
		h.mu.Unlock()
		if open { // reported as stuck; its fields are still being written
			h.count("connections", 1)
			continue
		}
		h.judgeOne(p, cr, br)
	}
}

func (h *harness) judgeOne(p *plan, cr *cliResult, br *beResult) {
	id := p.id
	h.count("connections", 1)
	h.count("connections to "+p.svc.name, 1)
	if cr.dialErr != nil {
		if p.svc.dyn {
			h.count("refused at connect (dyn, its listener removed)", 1)
			return
		}
		h.fail(classRefused, id, fmt.Sprintf("dial %s (%s): %v", p.svc.addr, p.svc.name, cr.dialErr))
		return
	}
	for _, m := range []struct {
		dir string
		m   *mismatch
	}{{"down (at the client)", cr.bad}, {"up (at the backend)", beBad(br)}} {
		if m.m == nil {
			continue
		}
		class := classCorrupt
		if m.m.foreign != 0 {
			class = classForeign
		}
		h.fail(class, id, fmt.Sprintf("%s, %s: at offset %d, %s", p.svc.name, m.dir, m.m.off, m.m.what))
	}
	if br != nil {
		for _, pr := range br.problems {
			h.fail(classMisrouted, id, pr)
		}
		if p.svc.greet && cr.greetAcc != 0 && cr.greetAcc != br.accept {
			h.fail(classForeign, id, fmt.Sprintf("the greeting came from accept %#x, but the stream reached accept %#x (%s)", cr.greetAcc, br.accept, br.backend))
		}
		if br.upN == cr.upN && br.upCRC != cr.upCRC || br.downN == cr.downN && br.downCRC != cr.downCRC {
			h.fail(classCorrupt, id, "checksums differ at equal lengths")
		}
		h.count("bytes up", int(br.upN))
		h.count("bytes down", int(cr.downN))
	}
	exact := br != nil && br.upN == p.up && br.upEOF && cr.downN == p.down && cr.downEOF && cr.bad == nil && br.bad == nil
	stalled := cr.downErr == errStalled || cr.upErr == errStalled || br != nil && (br.upErr == errStalled || br.downErr == errStalled)
	urgent := p.cliOOB >= 0 || p.beOOB >= 0
	if stalled {
		class := classStalled
		if urgent {
			class = classUrgent
		}
		h.fail(class, id, h.describe(p, cr, br))
	}
	if exact {
		h.count("delivered byte-exact both ways", 1)
		if p.cliOOB >= 0 {
			h.count(fmt.Sprintf("  of them with a client urgent byte (passed on in the stream: %v)", br.oobInline), 1)
		}
		if p.beOOB >= 0 {
			h.count(fmt.Sprintf("  of them with a backend urgent byte (passed on in the stream: %v)", cr.oobInline), 1)
		}
		return
	}
	if why := h.excused(p, cr, br); why != "" {
		h.count("ended early, as the harness caused ("+why+")", 1)
		return
	}
	if p.svc.dyn && br == nil && cr.downN == 0 {
		h.count("not served (dyn, its listener removed)", 1)
		return
	}
	if stalled || cr.bad != nil || beBad(br) != nil {
		return // reported
	}
	if br == nil {
		switch h.stoppingRefused(p, cr) {
		case stopEarly:
			// A connection the old instance accepted before its listeners
			// were handed over is its to serve: Shutdown's drains stop new
			// connections only once every admission is done.
			h.fail(classStopping, id, h.describe(p, cr, br))
			return
		case stopLate: // its admission outlived the old instance's drain_timeout
			h.count("refused by a stopping instance past its drain_timeout (admission longer than the drain)", 1)
			return
		}
	}
	reset := isReset(cr.downErr) || isReset(cr.upErr) || br != nil && (isReset(br.upErr) || isReset(br.downErr))
	if why := h.lateSender(p, cr, br); why != "" {
		h.count("ended by the timed service's timer, the missing bytes written only as it fired (harness writers late)", 1)
		h.note(fmt.Sprintf("conn %d: no byte waited for the timer: %s; %s", p.id, why, h.describe(p, cr, br)))
		return
	}
	if urgent {
		h.fail(classUrgent, id, h.describe(p, cr, br))
		return
	}
	if reset {
		h.fail(classReset, id, h.describe(p, cr, br))
		return
	}
	h.fail(classTruncated, id, h.describe(p, cr, br))
}

// lateLimit is how long before fulcrum's timer ended a session a byte may
// have gone into its socket and still be counted as the timer's race, not
// a direction that failed to move it: a byte that waited longer, while
// fulcrum's other sessions ran, is a lost wake-up and fails the test.
const lateLimit = time.Second

// lateSender reports why the timed service's idle or half-close timer ended
// p's session legitimately: for each end that lacks bytes its peer sent,
// the first byte it lacks went into the peer's socket only after, or
// within lateLimit before, the session ended (its access line). The
// harness's writers wait for a token (busy) before each chunk; under load
// a writer waits seconds for one (seen: a backend that had the id at
// 310ms wrote its first byte at 4.4s, after the half-close timer fired),
// quiet for the whole timeout while its peer's FIN or the connect has
// started the timer. "" if not so: a byte that waited longer is a defect,
// and the failure stands. Before the urgent class: an urgent byte planned
// after bytes never written did not end the session.
func (h *harness) lateSender(p *plan, cr *cliResult, br *beResult) string {
	if !p.svc.timed {
		return ""
	}
	lines, ends := h.log.lines(keyOf(p.clientIP)), h.log.endedAt(keyOf(p.clientIP))
	if len(lines) != 1 || len(ends) != 1 || !strings.Contains(lines[0], " end=half-close timeout ") && !strings.Contains(lines[0], " end=idle timeout ") {
		return ""
	}
	end := ends[0]
	type dir struct {
		name  string
		got   int64
		marks []wmark
	}
	dirs := []dir{{"up", 0, cr.upMarks}} // no backend got its id, nor any byte
	if br != nil {
		dirs = []dir{{"down", cr.downN, br.downMarks}, {"up", br.upN, cr.upMarks}}
	}
	var why []string
	for _, d := range dirs {
		var sent int64
		if n := len(d.marks); n > 0 {
			sent = d.marks[n-1].to
		}
		if d.got >= sent {
			continue // all it was sent came
		}
		at := writtenBy(d.marks, d.got)
		if at.Before(end.Add(-lateLimit)) {
			return "" // waited in the socket: not the timer's race
		}
		why = append(why, fmt.Sprintf("%s: byte %d written %v after the end", d.name, d.got, at.Sub(end).Round(time.Millisecond)))
	}
	return strings.Join(why, ", ")
}

// How an instance that was stopping refused a connection (stoppingRefused).
const (
	stopNot   = iota // not so
	stopEarly        // within its drain_timeout: a connection dropped at a hand-over
	stopLate         // after it: the drain's deadline ended the admission
)

// stoppingRefused reports whether p's only access line says an instance
// that was stopping by then had no backend for it, and whether that was
// within the drain_timeout after it handed over.
func (h *harness) stoppingRefused(p *plan, cr *cliResult) int {
	lines := h.log.lines(keyOf(p.clientIP))
	if len(lines) != 1 || !strings.Contains(lines[0], " end=no backend ") {
		return stopNot
	}
	var n int
	if _, err := fmt.Sscanf(lines[0], "instance=%d ", &n); err != nil {
		return stopNot
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case n >= len(h.handover) || !cr.end.After(h.handover[n].Add(-time.Second)):
		return stopNot
	case cr.end.After(h.handover[n].Add(h.drainTimeout)):
		return stopLate
	}
	return stopEarly
}

func beBad(br *beResult) *mismatch {
	if br == nil {
		return nil
	}
	return br.bad
}

func isReset(err error) bool {
	return err != nil && err != errOwnReset && err != errStalled && err != errCorrupt
}

func (h *harness) describe(p *plan, cr *cliResult, br *beResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, order %d, started %v into the run", p.svc.name, p.order, cr.start.Sub(h.began).Round(time.Millisecond))
	if p.svc.pp {
		fmt.Fprintf(&b, ", PROXY v1 %v", p.ppV1)
	}
	if p.cliOOB >= 0 {
		fmt.Fprintf(&b, ", client urgent byte after %d", p.cliOOB)
	}
	if p.beOOB >= 0 {
		fmt.Fprintf(&b, ", backend urgent byte after %d", p.beOOB)
	}
	if p.cliSlow || p.beSlow {
		fmt.Fprintf(&b, ", slow readers client %v backend %v", p.cliSlow, p.beSlow)
	}
	if p.cliStall.d > 0 || p.beStall.d > 0 {
		fmt.Fprintf(&b, ", stalls client %v@%d backend %v@%d", p.cliStall.d, p.cliStall.at, p.beStall.d, p.beStall.at)
	}
	fmt.Fprintf(&b, "; client sent %d/%d (%v), got %d/%d (eof %v, %v)", cr.upN, p.up, cr.upErr, cr.downN, p.down, cr.downEOF, cr.downErr)
	if br == nil {
		b.WriteString("; no backend got its id")
	} else {
		fmt.Fprintf(&b, "; backend %s got %d/%d (eof %v, %v), sent %d (%v)", br.backend, br.upN, p.up, br.upEOF, br.upErr, br.downN, br.downErr)
	}
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(cr.start).Round(time.Millisecond).String()
	}
	first := func(m []wmark) string {
		if len(m) == 0 {
			return "-"
		}
		return fmt.Sprintf("%d bytes by %s", m[0].to, at(m[0].at))
	}
	fmt.Fprintf(&b, "; times from the dial: client's first write %s, wrote all %s, down ended %s", first(cr.upMarks), at(cr.wrote), at(cr.downEnd))
	if br != nil {
		fmt.Fprintf(&b, "; backend had the id %s, first write %s, wrote all %s, up ended %s", at(br.idAt), first(br.downMarks), at(br.wrote), at(br.upEnd))
	}
	for _, t := range h.log.endedAt(keyOf(p.clientIP)) {
		fmt.Fprintf(&b, "; access line at %s", at(t))
	}
	fmt.Fprintf(&b, "; %v, access: %s", cr.end.Sub(cr.start).Round(time.Millisecond), strings.Join(h.log.lines(keyOf(p.clientIP)), " | "))
	return b.String()
}

// checkGauges waits for every counter of a connection to be back at 0.
func (h *harness) checkGauges(insts []*instance) {
	var last string
	ok := poll(15*time.Second, func() bool {
		var bad []string
		for _, in := range insts {
			if n := in.srv.Conns(); n != 0 {
				bad = append(bad, fmt.Sprintf("instance %d Server.Conns %d", in.n, n))
			}
			t := in.m.Table()
			if t == nil {
				continue
			}
			for _, s := range t.Services {
				g, _ := in.srv.Admission(s.Name)
				if g.Active != 0 || g.Waiting != 0 {
					bad = append(bad, fmt.Sprintf("instance %d service %s slots %d waiting %d", in.n, s.Name, g.Active, g.Waiting))
				}
				if g.Holding != 0 {
					bad = append(bad, fmt.Sprintf("instance %d service %s holding %d", in.n, s.Name, g.Holding))
				}
				for _, tg := range s.All() {
					if a := tg.B.Active(); a != 0 {
						bad = append(bad, fmt.Sprintf("instance %d %s/%s active %d", in.n, s.Name, tg.B.Name, a))
					}
				}
			}
		}
		last = strings.Join(bad, "; ")
		return len(bad) == 0
	})
	if !ok {
		h.fail(classGauge, 0, "15s after the last connection ended: "+last)
	}
}

// checkAccess holds the access log to exactly one line per connection.
func (h *harness) checkAccess() {
	h.mu.Lock()
	defer h.mu.Unlock()
	known := map[string]bool{}
	var missing []uint64
	for id, p := range h.plans {
		k := keyOf(p.clientIP)
		known[k] = true
		lines := h.log.lines(k)
		cr := h.cli[id]
		switch {
		case len(lines) > 1:
			msg := fmt.Sprintf("conn %d (%s): %d access lines: %s", id, p.svc.name, len(lines), strings.Join(lines, " | "))
			h.fails[classAccess] = append(h.fails[classAccess], msg)
			if knownDefect(classAccess, msg, false, false) && !h.c1 {
				h.c1 = true
				h.notes = append(h.notes, "C1 (a session finished twice): "+msg)
			}
		case len(lines) == 0 && cr != nil && cr.dialErr == nil && !(p.svc.dyn && h.be[id] == nil):
			missing = append(missing, id)
		}
	}
	h.mu.Unlock()
	for _, id := range missing {
		h.mu.Lock()
		p, cr, br := h.plans[id], h.cli[id], h.be[id]
		h.mu.Unlock()
		h.fail(classAccess, id, "no access line: "+h.describe(p, cr, br))
	}
	h.mu.Lock()
	for k, lines := range h.log.snapshot() {
		if !known[k] {
			h.fails[classAccess] = append(h.fails[classAccess], fmt.Sprintf("%d access lines for client %s, no connection of the harness's: %s", len(lines), k, strings.Join(lines, " | ")))
		}
	}
}

// countFDs counts this process's descriptors, and the pipes among them.
func countFDs(t *testing.T) (all, pipes int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "pipe:") {
			pipes++
		}
	}
	return len(ents), pipes
}

func (h *harness) checkFDs(base, basePipes int) {
	var n, p int
	if !poll(15*time.Second, func() bool {
		runtime.GC()
		n, p = countFDs(h.t)
		return n <= base && p <= basePipes
	}) {
		h.fail(classFD, 0, fmt.Sprintf("%d descriptors open (%d pipes); %d at the start (%d pipes)", n, p, base, basePipes))
	}
}

func (h *harness) dumpGoroutines() {
	f, err := os.CreateTemp("", fmt.Sprintf("torture-%d-goroutines-*.txt", h.seed))
	if err != nil {
		return
	}
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	f.Write(b.Bytes())
	f.Close()
	h.note("goroutine dump: " + f.Name())
	// C1's second finish takes a slot of the connection limit that is not
	// its own: the accept loop that then gives back the slot it held for an
	// empty accept queue waits in acceptRaw for ever, with its socket, a
	// reload retiring it and Shutdown behind it.
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "[chan receive") && strings.Contains(g, "fulcrum/listener.acceptRaw.func1(") {
			h.markC1("an accept loop waits in acceptRaw to give back a slot of the connection limit that another finish took")
			break
		}
	}
}

// markC1 records a mark that only issue 24's C1 (a session finished
// twice) leaves: what follows from it (descriptors closed under other
// connections, the connection limit's count and the WaitGroup wrong) is
// then known too.
func (h *harness) markC1(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.c1 {
		h.notes = append(h.notes, "C1 (a session finished twice): "+why)
	}
	h.c1 = true
}

// report logs what was driven and found, and fails the test on every class
// of failure (one that bears only a known defect's marks only when strict).
func (h *harness) report(driven time.Duration, insts []*instance, strict bool) {
	t := h.t
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "torture run, seed %d: driven for %v\n", h.seed, driven.Round(time.Millisecond))
	keys := make([]string, 0, len(h.counts))
	for k := range h.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-62s %d\n", k, h.counts[k])
	}
	var planned [6]int
	for _, p := range h.plans {
		if p.rstClientDown >= 0 {
			planned[0]++
		}
		if p.rstBackendUp >= 0 || p.rstBackendDown >= 0 {
			planned[1]++
		}
		if p.cliOOB >= 0 || p.beOOB >= 0 {
			planned[2]++
		}
		if p.cliStall.d > 0 || p.beStall.d > 0 {
			planned[3]++
		}
		if p.cliSlow || p.beSlow {
			planned[4]++
		}
		if p.up >= 8<<20 || p.down >= 8<<20 {
			planned[5]++
		}
	}
	fmt.Fprintf(&b, "  planned: client resets %d, backend resets %d, urgent bytes %d, stalls %d, slow readers %d, streams of 8 MiB or more %d\n",
		planned[0], planned[1], planned[2], planned[3], planned[4], planned[5])
	fmt.Fprintf(&b, "  backend connections with no stream (health checks, cut before a byte): %d\n", h.anon.Load())
	for _, in := range insts {
		fmt.Fprintf(&b, "  instance %d: Run returned %v after its cancel\n", in.n, time.Duration(in.took.Load()).Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "  log lines by message: %v\n", h.log.msgCounts())
	fmt.Fprintf(&b, "  access lines by end: %v\n", h.log.endCounts())
	for _, n := range h.notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	h.log.mu.Lock()
	for _, w := range h.log.warns {
		fmt.Fprintf(&b, "  logged: %s\n", w)
	}
	h.log.mu.Unlock()
	t.Log(b.String())
	// Issue 24's C2 (a Cut between Track and begin wedges the session) shows
	// as sessions of the cut service that never move, then counters that
	// stay up and a Shutdown that never ends.
	c2 := len(h.fails[classStalled]) > 0
	for _, f := range h.fails[classStalled] {
		c2 = c2 && strings.Contains(f, ": cut, ")
	}
	c2 = c2 || h.c2
	for _, c := range classOrder {
		fs := h.fails[c]
		if len(fs) == 0 {
			continue
		}
		known := true
		for _, f := range fs {
			known = known && knownDefect(c, f, c2, h.c1)
		}
		msg := fmt.Sprintf("%s: %d (seed %d)\n  %s", c, len(fs), h.seed, strings.Join(head(fs, 12), "\n  "))
		if known && !strict {
			t.Logf("KNOWN (issue 24, not failing without FULCRUM_TORTURE_STRICT=1): %s", msg)
			continue
		}
		t.Error(msg)
	}
}

func head(s []string, n int) []string {
	if len(s) > n {
		return append(slices.Clone(s[:n]), fmt.Sprintf("... and %d more", len(s)-n))
	}
	return s
}

// poll waits for cond, checking every 20ms, for at most d.
func poll(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }() // exits when the group is done, or with the test binary
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

// sink is the zerolog writer of both instances: it keeps the access lines
// by client address, and records on_down's cuts as disruptions.
type sink struct {
	h      *harness
	mu     sync.Mutex // protects access, msgs, warns and down
	access map[string][]string
	ended  map[string][]time.Time // when each access line came, by key
	msgs   map[string]int
	warns  []string             // the first warnings and errors, as written
	down   map[string]time.Time // backends down (by their checks) since
}

func (s *sink) Write(p []byte) (int, error) {
	var m struct {
		Level, Message, Client, Backend, End, Error, Service string
		Closed                                               int   `json:"closed_at_deadline"`
		In                                                   int64 `json:"bytes_in"`
		Out                                                  int64 `json:"bytes_out"`
		Instance                                             int
	}
	if err := json.Unmarshal(p, &m); err != nil {
		return len(p), nil
	}
	now := time.Now()
	s.mu.Lock()
	s.msgs[m.Message]++
	if (m.Level == "warn" || m.Level == "error") && len(s.warns) < 40 && m.Message != "backend down" && m.Message != "sessions cut (on_down = close)" && m.Message != "connect failed" && m.Message != "backend drained" {
		s.warns = append(s.warns, string(bytes.TrimSpace(p)))
	}
	var since time.Time
	switch m.Message {
	case "backend down":
		if _, ok := s.down[m.Backend]; !ok {
			s.down[m.Backend] = now
		}
	case "backend up":
		since = s.down[m.Backend]
		delete(s.down, m.Backend)
	}
	if m.Message == "connection" {
		k := m.Client
		if ap, err := netip.ParseAddrPort(m.Client); err == nil {
			k = keyOf(ap.Addr())
		}
		line := fmt.Sprintf("instance=%d end=%s in=%d out=%d", m.Instance, m.End, m.In, m.Out)
		if m.Backend != "" {
			line += " backend=" + m.Backend
		}
		if m.Error != "" {
			line += " error=" + strconv.Quote(m.Error)
		}
		s.access[k] = append(s.access[k], line)
		if s.ended == nil {
			s.ended = map[string][]time.Time{}
		}
		s.ended[k] = append(s.ended[k], now)
	}
	s.mu.Unlock()
	switch {
	case !since.IsZero(): // no new connection while it was down; its sessions cut (on_down)
		s.h.disrupted(m.Backend, since.Add(-time.Second), now)
	case m.Message == "sessions cut (on_down = close)", m.Message == "backend down":
		s.h.disrupted(m.Backend, now.Add(-time.Second), now)
	case m.Message == "backend drained" && m.Closed > 0:
		s.h.disrupted(m.Backend, now.Add(-time.Second), now)
	}
	return len(p), nil
}

// flush ends the down windows of backends still down.
func (s *sink) flush() {
	s.mu.Lock()
	down := s.down
	s.down = map[string]time.Time{}
	s.mu.Unlock()
	for name, since := range down {
		s.h.disrupted(name, since.Add(-time.Second), time.Now())
	}
}

func (s *sink) lines(k string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.access[k])
}

func (s *sink) endedAt(k string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ended[k])
}

func (s *sink) snapshot() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string, len(s.access))
	for k, v := range s.access {
		out[k] = v
	}
	return out
}

func (s *sink) endCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, lines := range s.access {
		for _, l := range lines {
			if i := strings.Index(l, " end="); i >= 0 {
				e := l[i+5:]
				if j := strings.Index(e, " in="); j >= 0 {
					e = e[:j]
				}
				out[e]++
			}
		}
	}
	return out
}

func (s *sink) msgCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.msgs))
	for k, v := range s.msgs {
		out[k] = v
	}
	return out
}
