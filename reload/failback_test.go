package reload

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/sched"
	"fulcrum/statefile"
	"fulcrum/status"
)

// namer is a loopback backend that writes its name and a newline on each
// connection, then holds it until the client closes it. It can be killed
// (its listener and every connection closed at once) and brought back on
// the same address.
type namer struct {
	t    *testing.T
	name string
	addr string

	mu    sync.Mutex // protects ln and conns
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newNamer(t *testing.T, name string) *namer {
	n := &namer{t: t, name: name, addr: "127.0.0.1:0", conns: map[net.Conn]bool{}}
	n.start()
	t.Cleanup(n.kill)
	return n
}

// start listens on n's address (a free port the first time) and serves.
func (n *namer) start() {
	n.t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ln, err = net.Listen("tcp", n.addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		n.t.Fatalf("%s: listen again on %s: %v", n.name, n.addr, err)
	}
	n.addr = ln.Addr().String()
	n.mu.Lock()
	n.ln = ln
	n.mu.Unlock()
	n.wg.Add(1)
	go func() { // exits when kill closes ln
		defer n.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.conns[c] = true
			n.mu.Unlock()
			n.wg.Add(1)
			go func() { // exits when the client or kill closes c
				defer n.wg.Done()
				defer func() {
					n.mu.Lock()
					delete(n.conns, c)
					n.mu.Unlock()
					c.Close()
				}()
				fmt.Fprintf(c, "%s\n", n.name)
				var b [64]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// kill closes the listener and every connection, and waits for them.
func (n *namer) kill() {
	n.mu.Lock()
	if n.ln != nil {
		n.ln.Close()
		n.ln = nil
	}
	for c := range n.conns {
		c.Close()
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// trio is `first` over a, b and c with a tcp check, and failback set.
func trio(failback, onDown string, a, b, c *namer) string {
	extra := fmt.Sprintf("failback = %q\non_down = %q\n[services.db.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 2\nfall = 2\n", failback, onDown)
	return render(svc{name: "db", listen: []string{"127.0.0.1:0"}, scheduler: "first", extra: extra,
		backends: []be{{"a", a.addr, 1, ""}, {"b", b.addr, 1, ""}, {"c", c.addr, 1, ""}}})
}

// ask opens a connection through r's service and returns the backend that
// answered, and the connection (closed at the test's end).
func ask(t *testing.T, r *run) (string, net.Conn) {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.addr("127.0.0.1:0"), 5*time.Second)
	if err != nil {
		t.Fatalf("dial fulcrum: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return "", nil // refused or cut: no backend answered
	}
	c.SetReadDeadline(time.Time{})
	return strings.TrimSpace(line), c
}

// askAll makes n connections one after another, each closed at once, and
// returns who answered.
func askAll(t *testing.T, r *run, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		var c net.Conn
		out[i], c = ask(t, r)
		if c != nil {
			c.Close()
		}
	}
	return out
}

// allOf reports whether every answer is want.
func allOf(got []string, want string) bool {
	for _, g := range got {
		if g != want {
			return false
		}
	}
	return true
}

// failOver kills a and waits until new connections reach b; then brings a
// back and waits for its checks to pass. It returns when a came up.
func failOver(t *testing.T, r *run, a *namer) time.Time {
	t.Helper()
	if got := askAll(t, r, 3); !allOf(got, "a") {
		t.Fatalf("before the kill: %v; want a (first in the list)", got)
	}
	a.kill()
	awaitState(t, r, "db", "a", backend.StateDown, 10*time.Second)
	if got := askAll(t, r, 5); !allOf(got, "b") {
		t.Fatalf("with a down: %v; want b", got)
	}
	a.start()
	awaitState(t, r, "db", "a", backend.StateUp, 10*time.Second)
	_, _, since := backendOf(t, r, "db", "a").Health()
	return since
}

// withState runs a Manager with the state file at path, restored from it.
func withState(t *testing.T, path string) func(*Options) {
	return func(o *Options) { o.State = openState(t, path) }
}

// openState opens the state file at path as a start does.
func openState(t *testing.T, path string) *statefile.File {
	t.Helper()
	f, err := statefile.Open(path, false, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFailbackNever: first over three real backends with failback =
// "never". Killing the first moves new connections to the second; once the
// first is back and healthy, no new connection reaches it, and none does
// after a restart (a new Server and Manager from the same configuration
// and state file) either. Without failback (today's rule) it would at once.
func TestFailbackNever(t *testing.T) {
	a, b, c := newNamer(t, "a"), newNamer(t, "b"), newNamer(t, "c")
	dir := t.TempDir()
	sf := filepath.Join(dir, "state.json")
	r := startRun(t, dir, trio("never", "close", a, b, c), withState(t, sf))
	failOver(t, r, a)
	if got := askAll(t, r, 20); !allOf(got, "b") {
		t.Fatalf("with a back up, failback never: %v; want b every time", got)
	}
	if st := status.Of(status.Source{Snapshot: r.m.srv.Snapshot, Reloads: r.m.Status}); len(st.Services) != 1 || st.Services[0].Writer != "b" {
		t.Errorf("/status writer %+v; want b", st.Services)
	}
	r.stop() // writes the state file as it exits
	st, err := statefile.Read(sf)
	if err != nil || len(st.Writers) != 1 || st.Writers[0] != (statefile.Writer{Service: "db", Backend: "b", Since: st.Writers[0].Since}) || st.Writers[0].Since.IsZero() {
		t.Fatalf("state file writers %+v (%v); want db's writer b with its time", st.Writers, err)
	}

	r2 := startRun(t, dir, "", withState(t, sf)) // the file written above stays
	if got := askAll(t, r2, 20); !allOf(got, "b") {
		t.Fatalf("after the restart: %v; want b every time", got)
	}
	awaitState(t, r2, "db", "a", backend.StateUp, 10*time.Second) // a's checks pass in the new process too
	if got := askAll(t, r2, 10); !allOf(got, "b") {
		t.Fatalf("after the restart, a checked up: %v; want b every time", got)
	}
	// The writer fails: the next in file order that is up takes over (a),
	// and it is the writer from then on.
	b.kill()
	awaitState(t, r2, "db", "b", backend.StateDown, 10*time.Second)
	if got := askAll(t, r2, 5); !allOf(got, "a") {
		t.Fatalf("with b down: %v; want a", got)
	}
	b.start()
	awaitState(t, r2, "db", "b", backend.StateUp, 10*time.Second)
	if got := askAll(t, r2, 5); !allOf(got, "a") {
		t.Fatalf("with b back: %v; want a (the writer stays)", got)
	}
}

// TestFailbackAfter: with failback = "after:2s" the first backend gets new
// connections back only once it has been up for 2 s without a break (a
// flap within the 2 s starts the count again), and
// then the old writer's sessions are cut (on_down = "close"), ending as
// "writer moved".
func TestFailbackAfter(t *testing.T) {
	const after = 2 * time.Second
	a, b, c := newNamer(t, "a"), newNamer(t, "b"), newNamer(t, "c")
	r := startRun(t, t.TempDir(), trio("after:2s", "close", a, b, c))
	first := failOver(t, r, a)
	// A flap within the 2 s: the count starts again when a is back.
	a.kill()
	awaitState(t, r, "db", "a", backend.StateDown, 10*time.Second)
	if since := time.Since(first); since >= after {
		t.Logf("the flap came %v after a came up, not within %v: the machine is slow; the count is still checked from the second up", since, after)
	}
	name, held := ask(t, r) // a session on the writer, to be cut as the writer moves
	if name != "b" {
		t.Fatalf("session opened with a down: reached %q; want b", name)
	}
	a.start()
	awaitState(t, r, "db", "a", backend.StateUp, 10*time.Second)
	_, _, upSince := backendOf(t, r, "db", "a").Health()
	var early int
	for deadline := time.Now().Add(after + 10*time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, conn := ask(t, r)
		at := time.Now()
		if conn != nil {
			conn.Close()
		}
		if got == "a" {
			if at.Before(upSince.Add(after)) {
				t.Fatalf("a got a connection %v after it came up; want none before %v", at.Sub(upSince), after)
			}
			t.Logf("back to a %v after it came up (%d connections to b meanwhile)", at.Sub(upSince), early)
			break
		}
		if at.After(deadline) {
			t.Fatalf("still not on a %v after it came up (last answer %q); want a after %v", at.Sub(upSince), got, after)
		}
		if got == "" && !at.Before(upSince.Add(after)) {
			continue // on b as the writer moved, and cut with b's sessions (on_down = "close"): as it should be
		}
		if got != "b" {
			t.Fatalf("during failback wait, %v after a came up: %q; want b", at.Sub(upSince), got)
		}
		early++
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("session on b after the writer moved: read %v; want it cut", err)
	}
	r.logs.Wait(t, 5*time.Second, "writer moved back to a", func(m map[string]any) bool {
		return m["message"] == "writer moved" && m["writer"] == "a" && m["was"] == "b"
	})
	r.logs.Wait(t, 5*time.Second, "b's sessions cut", func(m map[string]any) bool {
		return m["message"] == "sessions cut (writer moved, on_down = close)" && m["backend"] == "b"
	})
	r.logs.Wait(t, 5*time.Second, "the cut session's access line", func(m map[string]any) bool {
		return m["message"] == "connection" && m["backend"] == "b" && m["end"] == backend.CutWriter
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestFailbackManual: with failback = "manual" the first backend, back and
// healthy, gets nothing until the operator promotes it; then it takes
// every new connection, and a session on the old writer runs on
// (on_down = "keep").
func TestFailbackManual(t *testing.T) {
	a, b, c := newNamer(t, "a"), newNamer(t, "b"), newNamer(t, "c")
	r := startRun(t, t.TempDir(), trio("manual", "keep", a, b, c))
	failOver(t, r, a)
	name, held := ask(t, r)
	if name != "b" {
		t.Fatalf("session with a back: reached %q; want b", name)
	}
	// Longer than after:2s would wait, and many check intervals.
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		if got := askAll(t, r, 5); !allOf(got, "b") {
			t.Fatalf("with a back, before the promotion: %v; want b", got)
		}
	}
	if _, err := r.m.Promote("db", "c", "test"); err != nil {
		t.Fatalf("promote c: %v", err)
	}
	if got := askAll(t, r, 5); !allOf(got, "c") {
		t.Fatalf("after promoting c: %v; want c", got)
	}
	if changed, err := r.m.Promote("db", "a", "test"); err != nil || !changed {
		t.Fatalf("promote a: %v, %v; want changed", changed, err)
	}
	if got := askAll(t, r, 5); !allOf(got, "a") {
		t.Fatalf("after promoting a: %v; want a", got)
	}
	if changed, err := r.m.Promote("db", "a", "test"); err != nil || changed {
		t.Errorf("promote a again: %v, %v; want unchanged", changed, err)
	}
	held.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := held.Read(make([]byte, 1)); !isTimeout(err) {
		t.Errorf("session on b (on_down = keep) after the promotion: %v; want it open", err)
	}
	c.kill()
	awaitState(t, r, "db", "c", backend.StateDown, 10*time.Second)
	if _, err := r.m.Promote("db", "c", "test"); err == nil || !strings.Contains(err.Error(), "is not up") {
		t.Errorf("promote a down backend: %v; want refused, not up", err)
	}
	if _, err := r.m.Promote("db", "nosuch", "test"); err == nil {
		t.Errorf("promote an unknown backend: no error")
	}
	r.logs.Wait(t, 5*time.Second, "the promotion's line", func(m map[string]any) bool {
		return m["message"] == "writer moved" && m["writer"] == "a" && strings.HasPrefix(fmt.Sprint(m["reason"]), "promoted by test")
	})
}

// TestFailbackDefault: without failback, first goes back to the first
// backend as soon as it is up (today's behaviour), and Promote is refused.
func TestFailbackDefault(t *testing.T) {
	a, b, c := newNamer(t, "a"), newNamer(t, "b"), newNamer(t, "c")
	text := strings.Replace(trio("never", "keep", a, b, c), "failback = \"never\"\n", "", 1)
	r := startRun(t, t.TempDir(), text)
	failOver(t, r, a)
	if got := askAll(t, r, 5); !allOf(got, "a") {
		t.Fatalf("without failback, a back: %v; want a", got)
	}
	if _, err := r.m.Promote("db", "b", "test"); err == nil || !strings.Contains(err.Error(), "has no failback") {
		t.Errorf("promote without failback: %v; want refused", err)
	}
}

// TestChooseWriter: the rule on its own, at chosen times.
func TestChooseWriter(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ts := []sched.Target{{B: backend.New("s", "a"), Weight: 1}, {B: backend.New("s", "b"), Weight: 1}}
	after := &conf.Service{Failback: "after", FailbackAfter: 10 * time.Second}
	never := &conf.Service{Failback: "never"}
	if w, why, _ := chooseWriter(never, ts, writerState{}, t0, t0); w.name != "a" || why != "first writer" {
		t.Errorf("no writer yet: %q (%s); want a", w.name, why)
	}
	if w, why, due := chooseWriter(never, ts, writerState{"b", t0}, t0, t0.Add(time.Hour)); w.name != "b" || why != "" || !due.IsZero() {
		t.Errorf("never, b writer: %q (%s, %v); want b kept", w.name, why, due)
	}
	// a is up since it was created (zero upSince): counted from floor.
	if w, _, due := chooseWriter(after, ts, writerState{"b", t0}, t0.Add(5*time.Second), t0.Add(6*time.Second)); w.name != "b" || !due.Equal(t0.Add(15*time.Second)) {
		t.Errorf("after, 1s since start: %q due %v; want b, due at floor+10s", w.name, due)
	}
	if w, why, _ := chooseWriter(after, ts, writerState{"b", t0}, t0.Add(5*time.Second), t0.Add(15*time.Second)); w.name != "a" || why == "" {
		t.Errorf("after, 10s since start: %q (%s); want a", w.name, why)
	}
	ts[1].Weight = 0 // the writer drained: the first up takes over
	if w, why, _ := chooseWriter(never, ts, writerState{"b", t0}, t0, t0); w.name != "a" || !strings.Contains(why, "not up") {
		t.Errorf("never, b at weight 0: %q (%s); want a", w.name, why)
	}
	ts[0].Weight = 0
	if w, _, _ := chooseWriter(never, ts, writerState{"b", t0}, t0, t0); w.name != "b" {
		t.Errorf("nothing up: %q; want b remembered", w.name)
	}
}
