package reload

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/statefile"
	"fulcrum/status"
)

// await polls cond until it holds or within passes: status has no event of
// its own to wait on.
func await(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// findBackend returns a backend's row in st, or nil.
func findBackend(st status.Status, service, name string) *status.Backend {
	for _, s := range st.Services {
		if s.Name != service {
			continue
		}
		for i := range s.Backends {
			if s.Backends[i].Name == name {
				return &s.Backends[i]
			}
		}
	}
	return nil
}

// TestRemovedDrainingInView: a backend removed from the file while a
// session is open stays in the status (and so in /status, metrics and the
// STATUS= line) as draining, with its connection and deadline, until the
// session ends; a weight-0 backend is draining and not up.
func TestRemovedDrainingInView(t *testing.T) {
	holdSrv := testkit.NewServer(t, testkit.Echo)
	other := testkit.NewServer(t, testkit.Echo)
	text := func(withA bool) string {
		bs := []be{{name: "b", addr: other.Addr, weight: 1}, {name: "z", addr: other.Addr, weight: 0}}
		if withA {
			bs = append([]be{{name: "a", addr: holdSrv.Addr, weight: 1}}, bs...)
		}
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "first", extra: "drain_timeout = \"30s\"", backends: bs})
	}
	r := startRun(t, t.TempDir(), text(true))
	src := status.Source{Snapshot: r.m.srv.Snapshot, Reloads: r.m.Status, Draining: r.m.Draining}
	if z := findBackend(status.Of(src), "s", "z"); z == nil || z.State != "draining" || z.Cause != "weight 0" || z.Up() {
		t.Fatalf("weight-0 backend: %+v; want draining (weight 0), not up", z)
	}

	c, err := net.Dial("tcp", r.addr("127.0.0.1:0")) // "first": to a
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("x"))
	c.Read(make([]byte, 1)) // the echo: the session is open on a
	renameOver(t, r.path, text(false))
	r.expectGen(2, 5*time.Second)

	st := status.Of(src)
	a := findBackend(st, "s", "a")
	if a == nil || a.State != "draining" || !a.Removed || a.Active != 1 || a.DrainDeadline.IsZero() || a.Cause != "removed" {
		t.Fatalf("removed backend with a session: %+v; want draining, removed, 1 active, a deadline", a)
	}
	if left := time.Until(a.DrainDeadline); left <= 0 || left > 30*time.Second {
		t.Errorf("time left %v; want within drain_timeout", left)
	}
	if line := st.Line(); !strings.Contains(line, "backends 1/2 up") || !strings.Contains(line, "1 removed backends draining") {
		t.Errorf("STATUS= %q; want b up of b and z, and a draining", line)
	}
	c.Close()
	await(t, 10*time.Second, "the drained backend leaves the status", func() bool {
		return findBackend(status.Of(src), "s", "a") == nil
	})
}

// TestStateFile: overrides and health are written to the state file on
// change, survive a reload, and at the next start a backend that was down
// stays out until its checks pass rise times; a removed backend's override
// is gone.
func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	live := testkit.NewServer(t, testkit.Echo)
	health := "[services.s.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 3\nfall = 1\n"
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr", extra: health, backends: []be{
		{name: "a", addr: live.Addr, weight: 1}, {name: "dead", addr: testkit.DeadAddr(t), weight: 1}, {name: "m", addr: live.Addr, weight: 1}}})
	r := startRun(t, dir, text, withState(t, state))
	if _, err := r.m.SetOverride("s", "m", backend.Maint, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.SetOverride("s", "nosuch", backend.Drain, "test"); err == nil {
		t.Error("SetOverride of an unknown backend succeeded")
	}
	read := func() statefile.State {
		st, err := statefile.Read(state)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	find := func(st statefile.State, name string) *statefile.Backend {
		for i := range st.Backends {
			if st.Backends[i].Backend == name {
				return &st.Backends[i]
			}
		}
		return nil
	}
	await(t, 10*time.Second, "the state file names m in maint and dead down", func() bool {
		st := read()
		m, d := find(st, "m"), find(st, "dead")
		return m != nil && m.Override == "maint" && d != nil && d.Down
	})
	// A reload keeps the override.
	renameOver(t, r.path, text+"\n# touched\n")
	r.expectGen(2, 5*time.Second)
	if b := findBackend(status.Of(status.Source{Snapshot: r.m.srv.Snapshot}), "s", "m"); b == nil || b.State != "maint" || b.Override != "maint" || b.Weight != 0 {
		t.Fatalf("after a reload: %+v; want maint, weight 0", b)
	}
	r.stop()
	var raw map[string]any
	data, _ := os.ReadFile(state)
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("state file is not JSON: %v\n%s", err, data)
	}
	if !conf.IsStateFile(data) || raw["fulcrum_state"] != float64(statefile.Format) {
		t.Errorf("the state file does not begin with the header conf looks for:\n%s", data)
	}

	// Next start: "dead" now answers, but was down: it waits for rise
	// checks; m is still in maint.
	d := find(read(), "dead")
	if d == nil {
		t.Fatal("dead is not in the state file")
	}
	lateLive := testkit.NewServer(t, testkit.Echo)
	text2 := strings.Replace(text, findAddr(t, text, "dead"), lateLive.Addr, 1)
	dir2 := t.TempDir()
	r2 := startRun(t, dir2, text2, withState(t, state))
	src := status.Source{Snapshot: r2.m.srv.Snapshot}
	if b := findBackend(status.Of(src), "s", "dead"); b == nil || b.State != "down" || !strings.Contains(b.Reason, "before the restart") {
		t.Fatalf("restored backend at start: %+v; want down since before the restart", b)
	}
	if b := findBackend(status.Of(src), "s", "m"); b == nil || b.State != "maint" {
		t.Fatalf("restored override: %+v; want maint", b)
	}
	await(t, 10*time.Second, "dead comes up after rise checks", func() bool {
		b := findBackend(status.Of(src), "s", "dead")
		return b != nil && b.State == "up"
	})
	if b := findBackend(status.Of(src), "s", "dead"); b.LastCheck == nil || !b.LastCheck.OK {
		t.Errorf("last check %+v; want a passed one", b.LastCheck)
	}
	// Removing m clears its override: added back, it is ready.
	noM := strings.Replace(text2, "name = \"m\"", "name = \"m2\"", 1)
	renameOver(t, r2.path, noM)
	r2.expectGen(2, 5*time.Second)
	renameOver(t, r2.path, text2)
	r2.expectGen(3, 5*time.Second)
	if b := findBackend(status.Of(src), "s", "m"); b == nil || b.Override != "" {
		t.Errorf("re-added m: %+v; want no override", b)
	}
}

// findAddr returns the address of backend name in a rendered file.
func findAddr(t *testing.T, text, name string) string {
	t.Helper()
	i := strings.Index(text, "name = \""+name+"\"")
	if i < 0 {
		t.Fatalf("no backend %s", name)
	}
	rest := text[i:]
	j := strings.Index(rest, "address = \"")
	rest = rest[j+len("address = \""):]
	return rest[:strings.Index(rest, "\"")]
}
