package reload

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
)

// run is a Manager following a real file in a temporary directory.
type run struct {
	t      *testing.T
	dir    string
	path   string
	srv    *listener.Server
	m      *Manager
	logs   *testkit.LogSink
	events chan string // what the Manager notified, READY=1 after each attempt
	hup    chan struct{}
	cancel context.CancelFunc
	done   chan error
}

// svc describes one service of a generated configuration.
type svc struct {
	name      string
	listen    []string
	scheduler string
	backends  []be
	extra     string // more service keys, one per line
}

type be struct {
	name, addr string
	weight     int
	extra      string // more backend keys, one per line
}

func render(services ...svc) string {
	var b strings.Builder
	b.WriteString("[log]\nformat = \"json\"\n[reload]\ndebounce = \"100ms\"\n")
	for _, s := range services {
		sched := s.scheduler
		if sched == "" {
			sched = "wrr"
		}
		fmt.Fprintf(&b, "\n[services.%s]\nlisten = [%q", s.name, s.listen[0])
		for _, l := range s.listen[1:] {
			fmt.Fprintf(&b, ", %q", l)
		}
		extra := s.extra
		if !strings.Contains(extra, "drain_timeout") { // a failed test must not wait the 5m default
			extra = "drain_timeout = \"3s\"\n" + extra // before any sub-table extra may open
		}
		fmt.Fprintf(&b, "]\nscheduler = %q\n%s\n", sched, extra)
		for _, x := range s.backends {
			fmt.Fprintf(&b, "[[services.%s.backends]]\nname = %q\naddress = %q\nweight = %d\n%s\n", s.name, x.name, x.addr, x.weight, x.extra)
		}
	}
	return b.String()
}

// startRun writes text to dir/fulcrum.toml (unless the file exists already,
// as a symlink layout made by the test) and runs a Manager on it, after
// applying opts to its Options.
func startRun(t *testing.T, dir, text string, opts ...func(*Options)) *run {
	t.Helper()
	r := &run{t: t, dir: dir, path: filepath.Join(dir, "fulcrum.toml"), logs: testkit.NewLogSink(),
		events: make(chan string, 4096), hup: make(chan struct{}, 1), done: make(chan error, 1)}
	if _, err := os.Lstat(r.path); os.IsNotExist(err) {
		writeInPlace(t, r.path, text)
	}
	cfg, err := conf.Load(r.path)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(r.logs)
	r.srv = listener.New(log)
	opt := Options{Hup: r.hup, Notify: func(s string) error {
		r.events <- s
		return nil
	}}
	for _, o := range opts {
		o(&opt)
	}
	r.m = New(r.path, r.srv, log, opt)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.m.Run(ctx, cfg) }() // exits when the test's cleanup cancels ctx
	t.Cleanup(r.stop)
	r.expectGen(1, 5*time.Second) // the first configuration is applied
	return r
}

func (r *run) stop() {
	r.cancel()
	if err := <-r.done; err != nil {
		r.t.Errorf("Run: %v", err)
	}
	r.done <- nil // stop may be called again
}

// attempt waits for the next finished reload attempt (applied or refused).
func (r *run) attempt(within time.Duration) {
	r.t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		select {
		case s := <-r.events:
			if strings.HasPrefix(s, "READY=1") {
				return
			}
		case <-timeout.C:
			r.t.Fatalf("no reload attempt finished within %v (generation %d; last error %q)", within, r.gen(), r.m.Status().LastError)
		}
	}
}

func (r *run) gen() uint64 { return r.srv.Snapshot().Gen }

// admission reads service's admission counters.
func (r *run) admission(service string) listener.AdmissionStats {
	st, _ := r.srv.Admission(service)
	return st
}

// expectGen waits for one attempt and checks that it left generation want.
// An attempt that found the file empty is passed over, twice at most: a
// write in place is a truncation and a write, two events, and on a loaded
// machine the debounce can end between them (the empty file is refused, as
// it must be, and the write brings the next attempt).
func (r *run) expectGen(want uint64, within time.Duration) {
	r.t.Helper()
	for i := 0; ; i++ {
		r.attempt(within)
		g := r.gen()
		if g == want {
			return
		}
		if last := r.m.Status().LastError; i == 2 || !strings.Contains(last, "no services") {
			r.t.Fatalf("generation = %d after the reload; want %d (last error: %s)", g, want, last)
		}
	}
}

func (r *run) addr(listen string) string {
	a := r.srv.Addr(netip.MustParseAddrPort(listen))
	if a == nil {
		r.t.Fatalf("no listener for %s", listen)
	}
	return a.String()
}

// expectRefused waits for the attempt refused with an error containing
// want, passing over empty-file refusals as expectGen does, and checks that
// the generation did not move.
func (r *run) expectRefused(want string, within time.Duration) {
	r.t.Helper()
	g := r.gen()
	for i := 0; ; i++ {
		r.attempt(within)
		last := r.m.Status().LastError
		if strings.Contains(last, want) {
			break
		}
		if i == 2 || !strings.Contains(last, "no services") {
			r.t.Fatalf("last error %q; want %q", last, want)
		}
	}
	if r.gen() != g {
		r.t.Fatalf("generation %d after a refused file; want %d", r.gen(), g)
	}
}

// The ways files get replaced.

func writeInPlace(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil { // truncate + write, through any symlink
		t.Fatal(err)
	}
}

// renameOver writes a temporary file beside the real file and renames it
// over, as vim (backupcopy=no), sed -i, Ansible and consul-template do.
func renameOver(t *testing.T, path, text string) {
	t.Helper()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		real = path
	}
	tmp := filepath.Join(filepath.Dir(real), ".fulcrum.toml.tmp")
	writeInPlace(t, tmp, text)
	if err := os.Rename(tmp, real); err != nil {
		t.Fatal(err)
	}
}

// configMap is the Kubernetes ConfigMap volume layout: fulcrum.toml →
// ..data/fulcrum.toml, ..data → a timestamped directory swapped atomically.
type configMap struct {
	dir string
	n   int
}

func newConfigMap(t *testing.T, text string) *configMap {
	t.Helper()
	c := &configMap{dir: t.TempDir()}
	c.swap(t, text)
	if err := os.Symlink("..data/fulcrum.toml", filepath.Join(c.dir, "fulcrum.toml")); err != nil {
		t.Fatal(err)
	}
	return c
}

// swap publishes text as the kubelet does: a new directory, a new ..data
// link renamed over the old one, the old directory removed.
func (c *configMap) swap(t *testing.T, text string) {
	t.Helper()
	c.n++
	old := fmt.Sprintf("..2026_11_29_%04d", c.n-1)
	next := fmt.Sprintf("..2026_11_29_%04d", c.n)
	if err := os.Mkdir(filepath.Join(c.dir, next), 0o755); err != nil {
		t.Fatal(err)
	}
	writeInPlace(t, filepath.Join(c.dir, next, "fulcrum.toml"), text)
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(next, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(c.dir, old))
}

// greetEcho greets with its name, then echoes in user space.
func greetEcho(name string) func(*net.TCPConn) {
	return func(c *net.TCPConn) {
		if _, err := c.Write([]byte(name + "\n")); err != nil {
			return
		}
		testkit.Echo(c)
	}
}

func TestRunEditorStyles(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	b := testkit.NewServer(t, testkit.Greeter("b"))
	text := func(wa, wb int) string {
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, wa, ""}, {"b", b.Addr, wb, ""}}})
	}
	r := startRun(t, t.TempDir(), text(1, 1))
	const within = 20 * time.Second // a bound for a loaded machine; each wait returns at its event

	writeInPlace(t, r.path, text(2, 1))
	r.expectGen(2, within)

	renameOver(t, r.path, text(3, 1))
	r.expectGen(3, within)

	// vim with backupcopy=yes-less defaults: move the original aside, write
	// a new file, delete the backup.
	if err := os.Rename(r.path, r.path+"~"); err != nil {
		t.Fatal(err)
	}
	writeInPlace(t, r.path, text(4, 1))
	os.Remove(r.path + "~")
	r.expectGen(4, within)

	// Deleted: the running configuration stays; recreated: applied.
	os.Remove(r.path)
	r.logs.Wait(t, within, "about the missing file", testkit.Message("configuration file is gone; the running configuration stays"))
	if g := r.gen(); g != 4 {
		t.Fatalf("generation = %d after the file was deleted; want 4", g)
	}
	if name, err := testkit.Greeting(r.addr("127.0.0.1:0")); err != nil || (name != "a" && name != "b") {
		t.Fatalf("with the file deleted: greeting %q, %v", name, err)
	}
	writeInPlace(t, r.path, text(5, 1))
	r.expectGen(5, within)

	// The path becomes a symlink, then the link is swapped (ln -sfn makes a
	// new link and renames it over).
	conf := filepath.Join(r.dir, "conf.d")
	os.Mkdir(conf, 0o755)
	writeInPlace(t, filepath.Join(conf, "one.toml"), text(6, 1))
	writeInPlace(t, filepath.Join(conf, "two.toml"), text(7, 1))
	lnSfn := func(target string) {
		tmp := r.path + ".lnk"
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, r.path); err != nil {
			t.Fatal(err)
		}
	}
	lnSfn("conf.d/one.toml")
	r.expectGen(6, within)
	lnSfn("conf.d/two.toml")
	r.expectGen(7, within)
	// An edit of the symlink's target, in its own directory, is seen too.
	writeInPlace(t, filepath.Join(conf, "two.toml"), text(8, 1))
	r.expectGen(8, within)

	// The same content again is not a reload: the next attempt is the change
	// after it, and it makes generation 9, not 10.
	writeInPlace(t, filepath.Join(conf, "two.toml"), text(8, 1))
	writeInPlace(t, filepath.Join(conf, "two.toml"), text(9, 1))
	r.expectGen(9, within)

	// SIGHUP reloads even an unchanged file.
	r.hup <- struct{}{}
	r.expectGen(10, within)
	if st := r.m.Status(); st.Reloads != 9 || st.Failed != 0 || st.LastError != "" {
		t.Errorf("status = %+v; want 9 reloads, none failed", st)
	}
	if w := r.srv.Snapshot().Services[0].Targets[0].Weight; w != 9 {
		t.Errorf("weight of a = %d; want 9", w)
	}
}

func TestRunConfigMap(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	text := func(w int) string {
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, w, ""}}})
	}
	cm := newConfigMap(t, text(1))
	r := startRun(t, cm.dir, "")
	for i := 2; i <= 4; i++ {
		cm.swap(t, text(i))
		r.expectGen(uint64(i), 20*time.Second)
		if w := r.srv.Snapshot().Services[0].Targets[0].Weight; w != i {
			t.Fatalf("weight = %d after swap %d", w, i)
		}
	}
}

// TestRunBadFiles: invalid TOML, an unknown scheduler and a duplicate
// listener are each refused with a located log line while the old
// configuration serves every new connection; then a valid file applies.
func TestRunBadFiles(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	b := testkit.NewServer(t, testkit.Greeter("b"))
	good := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, 1, ""}, {"b", b.Addr, 1, ""}}})
	r := startRun(t, t.TempDir(), good)
	addr := r.addr("127.0.0.1:0")

	stop := make(chan struct{})
	result := make(chan [2]int, 1)
	go func() { // connects back to back until stop; exits then
		ok, failed := 0, 0
		for {
			select {
			case <-stop:
				result <- [2]int{ok, failed}
				return
			default:
			}
			if name, err := testkit.Greeting(addr); err == nil && (name == "a" || name == "b") {
				ok++
			} else {
				failed++
			}
		}
	}()

	bad := []struct {
		name, text, want string
	}{
		{"invalid TOML", strings.Replace(good, "[services.s]", "[services.s", 1), "fulcrum.toml:7: expected '.' or ']' to end table name"},
		{"unknown scheduler", strings.Replace(good, `scheduler = "wrr"`, `scheduler = "wlcx"`, 1), `fulcrum.toml:8: services.s.scheduler: "wlcx" is not one of`},
		{"duplicate listener", strings.Replace(good, `listen = ["127.0.0.1:0"]`, `listen = ["127.0.0.1:0", "127.0.0.1:7", "127.0.0.1:7"]`, 1),
			`fulcrum.toml:7: services.s.listen[2]: 127.0.0.1:7 is also listened on by services.s.listen[1]`},
		// The state file would overwrite the configuration (issue 30).
		{"state file is the configuration", "[admin]\nstate_file = \"" + r.path + "\"\n" + good,
			"fulcrum.toml:2: admin.state_file: " + r.path + " is this configuration file"},
		// 40 KB that took the decoder past 4 GB and the daemon with it (issue 24).
		{"nesting bomb", good + "[x]\ny = " + strings.Repeat("{a=", 10000) + "1" + strings.Repeat("}", 10000) + "\n",
			fmt.Sprintf("fulcrum.toml:%d: nested deeper than 32 levels", strings.Count(good, "\n")+2)},
	}
	for i, c := range bad {
		writeInPlace(t, r.path, c.text)
		r.expectRefused(c.want, 20*time.Second)
		st := r.m.Status()
		if st.Failed < uint64(i+1) || !strings.Contains(st.LastError, c.want) {
			t.Errorf("%s: status = %+v; want failure %d or later with %q", c.name, st, i+1, c.want)
		}
		line := r.logs.Wait(t, time.Second, "refusing "+c.name, func(m map[string]any) bool {
			return m["level"] == "error" && strings.Contains(fmt.Sprint(m["errors"]), c.want)
		})
		if !strings.HasPrefix(fmt.Sprint(line["message"]), "reload refused, generation 1 keeps serving: ") || line["trigger"] != "file" {
			t.Errorf("%s: log line %q (trigger %v)", c.name, line["message"], line["trigger"])
		}
		// Each problem is its own entry, none of them joined.
		if errs, ok := line["errors"].([]any); !ok || len(errs) == 0 || slices.ContainsFunc(errs, func(e any) bool { return strings.Contains(fmt.Sprint(e), "\n") }) {
			t.Errorf("%s: errors field %#v; want one entry per problem", c.name, line["errors"])
		}
	}
	writeInPlace(t, r.path, strings.Replace(good, "weight = 1", "weight = 2", 1))
	r.expectGen(2, 20*time.Second)
	if st := r.m.Status(); st.LastError != "" {
		t.Errorf("last error after a good reload = %q", st.LastError)
	}
	close(stop)
	res := <-result
	if res[1] != 0 || res[0] == 0 {
		t.Errorf("while bad files were refused: %d connections served, %d failed; want all served", res[0], res[1])
	}
}

// TestRunHalfWritten: a file truncated and written in place in two halves
// 400 ms apart (a slow `gen-config > fulcrum.toml`), the first cut mid-line,
// is not read until its writer closes it: no half is applied, or even
// tried, and no listener of the second service is closed meanwhile.
func TestRunHalfWritten(t *testing.T) {
	testkit.CheckLeaks(t)
	var bs []be
	for _, n := range []string{"a", "b", "c", "d"} {
		bs = append(bs, be{n, testkit.NewServer(t, testkit.Greeter(n)).Addr, 1, ""})
	}
	listen2 := testkit.FreeAddr(t)
	text := func(w int) string {
		x := append([]be(nil), bs...)
		x[0].weight = w
		return render(
			svc{name: "one", listen: []string{"127.0.0.1:0"}, backends: x[:2]},
			svc{name: "two", listen: []string{listen2}, backends: x[2:]},
		)
	}
	r := startRun(t, t.TempDir(), text(1))
	// An edit first, so that the check Run makes at start (off the loop) is
	// done: a read asked for before the writer began could see half a file.
	renameOver(t, r.path, text(2))
	r.expectGen(2, 20*time.Second)

	stop := make(chan struct{})
	bad := make(chan string, 1)
	go func() { // samples the table and listeners until stop; exits then
		defer close(bad)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			tb := r.srv.Snapshot()
			if len(tb.Services) != 2 || len(tb.Services[0].Targets)+len(tb.Services[1].Targets) != 4 ||
				r.srv.Addr(netip.MustParseAddrPort(listen2)) == nil {
				bad <- fmt.Sprintf("sample %d: generation %d has %d services", n, tb.Gen, len(tb.Services))
				return
			}
		}
	}()

	full := text(5)
	cut := strings.Index(full, "[services.two]") + len("[services.two]\nlisten = [\"127.0.")
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // on failure; closed below
	f.WriteString(full[:cut])
	time.Sleep(400 * time.Millisecond) // the writer's pause, part of the scenario
	if st := r.m.Status(); st.Failed != 0 || r.gen() != 2 {
		t.Errorf("while the writer paused: generation %d, status %+v; want the file not read yet", r.gen(), st)
	}
	f.WriteString(full[cut:])
	f.Close()
	r.attempt(20 * time.Second)
	if g, st := r.gen(), r.m.Status(); g != 3 || st.Failed != 0 {
		t.Fatalf("after the writer closed the file: generation %d, status %+v; want 3, the first attempt", g, st)
	}
	close(stop)
	if msg, ok := <-bad; ok {
		t.Errorf("a half-written file took effect: %s", msg)
	}
	if w := r.srv.Snapshot().Services[0].Targets[0].Weight; w != 5 {
		t.Errorf("weight = %d after the completed file; want 5", w)
	}
}
