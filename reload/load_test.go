package reload

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
)

// session is a client connection through the proxy that greets and echoes.
type session struct {
	c       *net.TCPConn
	r       *bufio.Reader
	backend string
	seq     uint64
}

func dialSession(addr string) (*session, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	s := &session{c: c.(*net.TCPConn), r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	name, err := s.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	s.backend = strings.TrimSpace(name)
	return s, nil
}

// roundTrip sends one sequence-numbered, checksummed message and checks the
// echo byte for byte.
func (s *session) roundTrip(rng *rand.Rand) error {
	s.seq++
	payload := make([]byte, 16+rng.IntN(2000))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	msg := binary.BigEndian.AppendUint64(nil, s.seq)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(payload)))
	msg = append(msg, payload...)
	sum := sha256.Sum256(msg)
	msg = append(msg, sum[:]...)
	s.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.c.Write(msg); err != nil {
		return fmt.Errorf("seq %d: write: %w", s.seq, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s.r, got); err != nil {
		return fmt.Errorf("seq %d: read: %w", s.seq, err)
	}
	if !bytes.Equal(got, msg) || sha256.Sum256(got[:len(got)-32]) != [32]byte(got[len(got)-32:]) ||
		binary.BigEndian.Uint64(got) != s.seq {
		return fmt.Errorf("seq %d: echo differs", s.seq)
	}
	return nil
}

// TestRunDrain: a removed backend with 50 open connections gets no new
// connection, its open ones keep working until they end, and those still
// open at drain_timeout are closed then and counted.
func TestRunDrain(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, greetEcho("a"))
	b := testkit.NewServer(t, greetEcho("b"))
	const drain = 2 * time.Second
	extra := fmt.Sprintf("drain_timeout = %q", drain)
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: extra,
		backends: []be{{"a", a.Addr, 0, ""}, {"b", b.Addr, 1, ""}}}))
	addr := r.addr("127.0.0.1:0")
	rng := rand.New(rand.NewPCG(1, 1))
	var open []*session
	for range 50 {
		s, err := dialSession(addr)
		if err != nil || s.backend != "b" {
			t.Fatalf("session: %v, %v", s, err)
		}
		defer s.c.Close()
		open = append(open, s)
	}
	removedB := r.srv.Snapshot().Services[0].Targets[1].B

	writeInPlace(t, r.path, render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: extra,
		backends: []be{{"a", a.Addr, 1, ""}}}))
	r.expectGen(2, 20*time.Second)
	applied := time.Now()
	if line := r.logs.Wait(t, time.Second, "reload report", testkit.Message("reload applied")); fmt.Sprint(line["removed"]) != "[s/b (50 open)]" {
		t.Errorf("reload report removed = %v; want [s/b (50 open)]", line["removed"])
	}

	for range 10 {
		s, err := dialSession(addr)
		if err != nil || s.backend != "a" {
			t.Fatalf("new session after removal: %+v, %v; want backend a", s, err)
		}
		s.c.Close()
	}
	if got := removedB.Stats().Total; got != 50 {
		t.Errorf("removed backend took %d connections in all; want the 50 from before", got)
	}
	for i, s := range open { // every open session still works
		if err := s.roundTrip(rng); err != nil {
			t.Fatalf("session %d after removal: %v", i, err)
		}
	}
	for _, s := range open[:25] { // half end on their own
		s.c.Close()
	}
	var wg sync.WaitGroup
	late := make(chan time.Duration, 25)
	for _, s := range open[25:] {
		wg.Add(1)
		go func() { // exits when fulcrum closes the session
			defer wg.Done()
			s.c.SetReadDeadline(time.Now().Add(drain + 5*time.Second))
			io.Copy(io.Discard, s.r)
			late <- time.Since(applied)
		}()
	}
	wg.Wait()
	close(late)
	for d := range late {
		if d < drain-time.Second || d > drain+time.Second {
			t.Errorf("a session still open at the drain deadline was closed after %v; want %v ± 1s", d, drain)
		}
	}
	line := r.logs.Wait(t, 5*time.Second, "drain report", testkit.Message("backend drained"))
	if line["closed_at_deadline"] != float64(25) || line["backend"] != "b" {
		t.Errorf("drain report = %v; want 25 closed at the deadline", line)
	}
	if n := removedB.Stats().DrainClosed; n != 25 {
		t.Errorf("DrainClosed = %d; want 25", n)
	}
}

// load is background traffic: persistent sessions doing checksummed round
// trips, and a stream of short connections.
type load struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	errs     chan error
	trips    atomic.Int64
	shorts   atomic.Int64
	sessions []*session
	once     sync.Once

	mu   sync.Mutex // protects seen
	seen []short    // the short connections, in order
}

// short is one short connection: when it started and which backend served it.
type short struct {
	start   time.Time
	backend string
}

// shortsSince waits for n short connections started after t and returns them.
func (l *load) shortsSince(tb testing.TB, t time.Time, n int) []short {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		var out []short
		for _, s := range l.seen {
			if s.start.After(t) {
				out = append(out, s)
			}
		}
		l.mu.Unlock()
		if len(out) >= n {
			return out[:n]
		}
		if time.Now().After(deadline) {
			tb.Fatalf("only %d short connections in 10s", len(out))
		}
		time.Sleep(5 * time.Millisecond) // the stream has no completion event to wait on
	}
}

func startLoad(t *testing.T, addr string, persistent int, pace time.Duration) *load {
	t.Helper()
	l := &load{stop: make(chan struct{}), errs: make(chan error, persistent+100)}
	t.Cleanup(func() { // on failure too, before the Manager's shutdown waits for sessions
		l.halt()
		for _, s := range l.sessions {
			s.c.Close()
		}
	})
	for i := range persistent {
		s, err := dialSession(addr)
		if err != nil {
			t.Fatalf("persistent session %d: %v", i, err)
		}
		l.sessions = append(l.sessions, s)
		l.wg.Add(1)
		go func() { // exits when stop is closed or a round trip fails
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				if err := s.roundTrip(rng); err != nil {
					l.errs <- fmt.Errorf("persistent %d (%s): %w", i, s.backend, err)
					return
				}
				l.trips.Add(1)
			}
		}()
	}
	l.wg.Add(1)
	go func() { // short connections until stop; exits then
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			start := time.Now()
			s, err := dialSession(addr)
			if err != nil {
				l.errs <- fmt.Errorf("short connection: %w", err)
				return
			}
			s.c.Close()
			l.shorts.Add(1)
			l.mu.Lock()
			l.seen = append(l.seen, short{start, s.backend})
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the stream's pace
		}
	}()
	return l
}

// halt stops the load; the sessions stay open.
func (l *load) halt() {
	l.once.Do(func() {
		close(l.stop)
		l.wg.Wait()
	})
}

// finish stops the load, checks every persistent session once more and
// reports every error seen.
func (l *load) finish(t *testing.T) {
	t.Helper()
	l.halt()
	close(l.errs)
	for err := range l.errs {
		t.Error(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for i, s := range l.sessions {
		if err := s.roundTrip(rng); err != nil {
			t.Errorf("persistent %d at the end: %v", i, err)
		}
		s.c.Close()
	}
}

// TestRunUnderLoad: 200 persistent checksummed sessions and a stream of new
// connections run while the file is rewritten 50 times, alternating an
// in-place write, a rename over and a ConfigMap symlink swap. No connection
// fails, no byte is lost or changed, and each weight set is in effect within
// 3s of its write (debounce 200ms; see the bound).
func TestRunUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("long test")
	}
	testkit.DeadAddr(t) // the runtime's network poller opens two descriptors on first use: before CheckLeaks counts (run alone, it failed on them)
	testkit.CheckLeaks(t)
	names := []string{"a", "b", "c"}
	addrs := make([]string, len(names))
	for i, n := range names {
		addrs[i] = testkit.NewServer(t, greetEcho(n)).Addr
	}
	weights := func(k int) []int { // one backend at 0 in turn, the others 1..3
		w := []int{1 + k%3, 1 + (k/3)%3, 1 + (k/9)%3}
		w[k%3] = 0
		return w
	}
	text := func(k int) string {
		w := weights(k)
		bs := make([]be, len(names))
		for i := range names {
			bs[i] = be{names[i], addrs[i], w[i], ""}
		}
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: bs})
	}
	cm := newConfigMap(t, text(0))
	r := startRun(t, cm.dir, "")
	addr := r.addr("127.0.0.1:0")
	l := startLoad(t, addr, 200, 50*time.Millisecond)

	var worst time.Duration
	for k := 1; k <= 50; k++ {
		written := time.Now()
		switch k % 3 {
		case 0:
			writeInPlace(t, r.path, text(k)) // through the symlinks, into the current ..data
		case 1:
			renameOver(t, r.path, text(k)) // over the real file, in its directory
		case 2:
			cm.swap(t, text(k))
		}
		r.expectGen(uint64(k+1), 5*time.Second) // a write in place may show an empty file first
		took := time.Since(written)
		worst = max(worst, took)
		// The promise is debounce (200ms) plus a build and a swap; a lost
		// inotify event would show as recheck (30s). 3s tells the two apart
		// on a busy 2-core machine under -race, where 1s was missed once
		// (1.23s) beside other suites while this run's own slowest was 0.7s.
		if took > 3*time.Second {
			t.Errorf("rewrite %d took effect after %v; want within 3s (debounce 200ms; a lost event would take recheck, 30s)", k, took)
		}
		// New connections follow the new weights: never the one at 0, and
		// some to each of the others. The stream is the only picker, so
		// twelve of its connections cover two full wrr cycles (Σw ≤ 6).
		w := weights(k)
		seen := map[string]int{}
		for _, sc := range l.shortsSince(t, written.Add(took), 12) {
			seen[sc.backend]++
		}
		for i, n := range names {
			if (w[i] == 0) != (seen[n] == 0) {
				t.Fatalf("rewrite %d: weights %v, new connections went %v", k, w, seen)
			}
		}
	}
	l.finish(t)
	t.Logf("50 rewrites: slowest took effect after %v; %d checksummed round trips and %d short connections, all clean",
		worst, l.trips.Load(), l.shorts.Load())
	if st := r.m.Status(); st.Reloads != 50 || st.Failed != 0 {
		t.Errorf("status = %+v; want 50 reloads, none failed", st)
	}
}

// TestRunSchedulerAndListener: under load, a reload that changes the
// scheduler and adds a listener causes no error, and both take effect.
func TestRunSchedulerAndListener(t *testing.T) {
	testkit.CheckLeaks(t)
	var bs []be
	for _, n := range []string{"a", "b", "c"} {
		bs = append(bs, be{n, testkit.NewServer(t, greetEcho(n)).Addr, 1, ""})
	}
	second := testkit.FreeAddr(t)
	r := startRun(t, t.TempDir(), render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: bs}))
	addr := r.addr("127.0.0.1:0")
	l := startLoad(t, addr, 20, 20*time.Millisecond)

	renameOver(t, r.path, render(svc{name: "s", listen: []string{"127.0.0.1:0", second}, scheduler: "lc", backends: bs}))
	r.expectGen(2, 20*time.Second)
	if s := r.srv.Snapshot().Services[0]; s.Scheduler != "lc" || fmt.Sprintf("%T", s.Picker) != "*sched.leastConnSched" {
		t.Errorf("scheduler %s, picker %T; want lc", s.Scheduler, s.Picker)
	}
	if name, err := testkit.Greeting(second); err != nil || name == "" {
		t.Errorf("the new listener: %q, %v", name, err)
	}
	line := r.logs.Wait(t, time.Second, "reload report", testkit.Message("reload applied"))
	if fmt.Sprint(line["schedulers"]) != "[s wrr→lc]" || fmt.Sprint(line["listeners_opened"]) != "["+second+"]" {
		t.Errorf("reload report = %v", line)
	}
	l.finish(t)
}

// TestRunManyReloads: 1,000 reloads (SIGHUP and file edits, with a listener
// coming and going) leave no goroutine, timer, watcher or descriptor behind.
func TestRunManyReloads(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	const extra = "127.0.0.2:0" // a fresh port at each bind: no other test can hold it
	text := func(k int) string {
		listen := []string{"127.0.0.1:0"}
		if k%10 == 5 {
			listen = append(listen, extra)
		}
		return render(svc{name: "s", listen: listen, backends: []be{{"a", a.Addr, 1 + k%7, ""}, {fmt.Sprint("x", k%3), a.Addr, 1, ""}}})
	}
	r := startRun(t, t.TempDir(), text(0))
	for k := 1; k <= 1000; k++ {
		want := r.gen() + 1
		writeInPlace(t, r.path, text(k))
		if k%20 != 0 { // most through SIGHUP; every 20th through the watcher and the debounce
			r.hup <- struct{}{}
		}
		// The write's own events may also reload (a debounce that fires
		// before the SIGHUP is read): wait until the new file is in effect.
		for r.gen() < want || r.srv.Snapshot().Services[0].Targets[0].Weight != 1+k%7 {
			r.attempt(20 * time.Second)
		}
		if st := r.m.Status(); st.LastError != "" {
			t.Fatalf("reload %d: %s", k, st.LastError)
		}
	}
	if name, err := testkit.Greeting(r.addr("127.0.0.1:0")); err != nil || name != "a" {
		t.Errorf("after 1,000 reloads: %q, %v", name, err)
	}
	r.stop() // the leak check runs after every cleanup
}

// bigConfig is one service with n backends.
func bigConfig(n, bump int) []byte {
	var b strings.Builder
	b.WriteString("[services.big]\nlisten = [\"127.0.0.1:0\"]\n")
	for i := range n {
		fmt.Fprintf(&b, "[[services.big.backends]]\nname = \"b%d\"\naddress = \"127.%d.%d.%d:5432\"\nweight = %d\n",
			i, i>>16&255, i>>8&255, i&255, 1+(i+bump)%10)
	}
	return []byte(b.String())
}

// BenchmarkReload10k measures a reload of a 10,000-backend service whose
// weights all change: parse + validate, and apply (build, swap, settle).
func BenchmarkReload10k(b *testing.B) {
	files := [][]byte{bigConfig(10000, 0), bigConfig(10000, 1)}
	srv := listener.New(zerolog.Nop())
	m := New("", srv, zerolog.Nop(), Options{})
	defer m.Shutdown(b.Context())
	cfg, err := conf.Parse("big.toml", files[0])
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Apply(cfg); err != nil {
		b.Fatal(err)
	}
	b.Run("parse", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := conf.Parse("big.toml", files[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	cfgs := make([]*conf.Config, 2)
	for i := range cfgs {
		cfgs[i], _ = conf.Parse("big.toml", files[i])
	}
	b.Run("apply", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := m.Apply(cfgs[1-i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
