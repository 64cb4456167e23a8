package reload

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/statefile"
)

// TestStopWritingStateFile: after StopWriting (a binary upgrade's new
// process owns the state file) a draining process writes it no more, not
// even at its last save, so it cannot overwrite what the new one wrote.
func TestStopWritingStateFile(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	live := testkit.NewServer(t, testkit.Echo)
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, scheduler: "rr", backends: []be{{name: "a", addr: live.Addr, weight: 1}}})
	sf := openState(t, state)
	r := startRun(t, dir, text, func(o *Options) { o.State = sf })
	override := func() string {
		st, err := statefile.Read(state)
		if err != nil {
			return ""
		}
		for _, b := range st.Backends {
			if b.Backend == "a" {
				return b.Override
			}
		}
		return ""
	}
	if _, err := r.m.SetOverride("s", "a", backend.Maint, "test"); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, func() error { // the writer gives no event but the file
		if got := override(); got != "maint" {
			return fmt.Errorf("the state file says %q for a; want maint", got)
		}
		return nil
	})
	sf.StopWriting()
	if _, err := r.m.SetOverride("s", "a", backend.Drain, "test"); err != nil {
		t.Fatal(err)
	}
	r.stop() // the last save
	if got := override(); got != "maint" {
		t.Errorf("state file after StopWriting says %q; want it untouched (maint)", got)
	}
}
