package reload

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// noRecheck turns off the periodic re-read, so that only file events can
// bring a reload.
func noRecheck(text string) string {
	return strings.Replace(text, "[reload]\n", "[reload]\nrecheck = \"0s\"\n", 1)
}

// TestRunDirRecreated: the configuration directory deleted and recreated
// (rm -rf, mkdir, a new file renamed in) is watched again once it is back,
// with a warning while it is gone, and later edits apply promptly even with
// recheck off.
func TestRunDirRecreated(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	text := func(w int) string {
		return noRecheck(render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, w, ""}}}))
	}
	dir := filepath.Join(t.TempDir(), "conf")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, dir, text(1))
	const within = 20 * time.Second // a bound for a loaded machine; each wait returns at its event
	writeInPlace(t, r.path, text(2))
	r.expectGen(2, within)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	r.logs.Wait(t, within, "a warning about the directory", testkit.Message("configuration directory is gone; watching its parent until it is back"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	renameOver(t, r.path, text(3))
	r.expectGen(3, within)
	r.logs.Wait(t, within, "the directory back", testkit.Message("configuration directory is back; watching it again"))

	writeInPlace(t, r.path, text(4)) // in place, in the new directory
	r.expectGen(4, within)
	if w := r.srv.Snapshot().Services[0].Targets[0].Weight; w != 4 {
		t.Errorf("weight = %d; want 4", w)
	}
}

// TestRunSiblingWrites: a file beside the configuration written every 50 ms
// (a log, a state file) neither triggers a reload nor delays one.
func TestRunSiblingWrites(t *testing.T) {
	testkit.CheckLeaks(t)
	a := testkit.NewServer(t, testkit.Greeter("a"))
	text := func(w int) string {
		return noRecheck(render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, w, ""}}}))
	}
	r := startRun(t, t.TempDir(), text(1))
	f, err := os.OpenFile(filepath.Join(r.dir, "other.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // appends every 50 ms until stop, for 10 s at most
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			select {
			case <-stop:
				return
			case <-tick.C:
				fmt.Fprintln(f, "x")
			}
		}
	}()
	defer func() { close(stop); <-done }()
	start := time.Now()
	renameOver(t, r.path, text(7))
	r.expectGen(2, 2*time.Second) // debounce 100ms: a delay of seconds means the sibling held it back
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the edit took %v with a sibling written every 50 ms", d)
	}
	if st := r.m.Status(); st.Reloads != 1 {
		t.Errorf("reloads = %d; want 1 (the sibling's writes are not reloads)", st.Reloads)
	}
}

// TestRunInotifyOverflow: with the kernel's inotify queue cut to 16 events
// for fulcrum's watcher, a burst of 1,000 events around an edit overflows
// it; the edit still applies within recheck + 1 s, and nothing crashes.
// It needs root, to lower fs.inotify.max_queued_events for the moment the
// watcher is created.
func TestRunInotifyOverflow(t *testing.T) {
	const sysctl = "/proc/sys/fs/inotify/max_queued_events"
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root: this test needs it to lower " + sysctl)
		}
		t.Skip("needs root to lower " + sysctl)
	}
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	lowered := func() (*watcher, error) { // the queue's size is fixed when it is created
		if err := os.WriteFile(sysctl, []byte("16"), 0o644); err != nil {
			return nil, err
		}
		defer os.WriteFile(sysctl, old, 0o644) // at once: other inotify users keep their queues
		return newWatcher()
	}
	a := testkit.NewServer(t, testkit.Greeter("a"))
	text := func(w int) string {
		return strings.Replace(render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, w, ""}}}),
			"[reload]\n", "[reload]\nrecheck = \"2s\"\n", 1)
	}
	r := startRun(t, t.TempDir(), text(1), func(o *Options) { o.newWatcher = lowered })
	if b, _ := os.ReadFile(sysctl); string(b) != string(old) {
		t.Fatalf("%s = %q; want it restored to %q", sysctl, b, old)
	}
	burst := func(from int) {
		for i := from; i < from+500; i++ { // distinct names: inotify merges only identical events
			os.WriteFile(filepath.Join(r.dir, fmt.Sprintf("burst-%d", i)), []byte("x"), 0o644)
		}
	}
	burst(0)
	start := time.Now()
	renameOver(t, r.path, text(2))
	burst(500)
	r.expectGen(2, 3*time.Second) // recheck + 1 s
	t.Logf("applied %v after the edit", time.Since(start).Round(time.Millisecond))
	r.logs.Wait(t, time.Second, "the overflow reported", func(m map[string]any) bool {
		return m["message"] == "file watcher error; re-reading the configuration" && strings.Contains(fmt.Sprint(m["error"]), "overflow")
	})
}
