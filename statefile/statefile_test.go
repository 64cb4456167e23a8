package statefile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/internal/testkit"
)

// TestReadDamaged: a state file that exists but is not a whole state
// is ErrDamaged (never an empty state that the first save would write over);
// a missing or empty one is an empty state; SetAside keeps a damaged one
// under a new name.
func TestReadDamaged(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	whole := "{\n  \"fulcrum_state\": 1,\n  \"saved\": \"2026-12-01T22:32:53Z\",\n  \"instance_drain\": {\"by\": \"SIGUSR1\", \"since\": \"2026-12-01T22:30:00Z\"}\n}\n"
	for _, c := range []struct {
		name, text string
		damaged    bool
	}{
		{"whole", whole, false},
		{"empty", "", false},
		{"cut in half", whole[:len(whole)/2], true},
		{"from a newer fulcrum", strings.Replace(whole, "\"fulcrum_state\": 1", "\"fulcrum_state\": 99", 1), true},
	} {
		if err := os.WriteFile(p, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := Read(p)
		if errors.Is(err, ErrDamaged) != c.damaged {
			t.Errorf("%s: Read = %v; want damaged %v", c.name, err, c.damaged)
		}
		if c.name == "whole" && (st.Instance == nil || st.Instance.By != "SIGUSR1") {
			t.Errorf("whole: %+v; want the drain", st)
		}
	}
	if _, err := Read(filepath.Join(dir, "missing.json")); err != nil {
		t.Errorf("missing: %v; want an empty state", err)
	}
	os.WriteFile(p, []byte(whole[:40]), 0o600)
	aside, err := SetAside(p, time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC))
	if err != nil || aside != p+".damaged-20261201T230000Z" {
		t.Fatalf("SetAside = %q, %v", aside, err)
	}
	if b, err := os.ReadFile(aside); err != nil || string(b) != whole[:40] {
		t.Errorf("kept aside: %q, %v", b, err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the damaged file is still at its path: %v", err)
	}
}

// TestOpen: a damaged file refuses the start and is left as it was, or with
// startEmpty is kept aside and nothing is restored; a whole one is
// restored; no path is no file, whose methods do nothing.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("{\"fulcrum_state\": 1, \"instance_dr"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := Open(p, false, zerolog.Nop()); !errors.Is(err, ErrRefused) || f != nil {
		t.Fatalf("Open(damaged) = %v, %v; want ErrRefused", f, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the refused file is gone: %v", err)
	}
	f, err := Open(p, true, zerolog.Nop())
	if err != nil || f == nil || f.Restored().Instance != nil {
		t.Fatalf("Open(damaged, startEmpty) = %+v, %v; want an empty state", f, err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the damaged file is still at its path: %v", err)
	}
	whole := State{Format: Format, Instance: &Drain{By: "SIGUSR1"}, Writers: []Writer{{Service: "db", Backend: "b"}}}
	data, _ := json.Marshal(whole)
	os.WriteFile(p, data, 0o600)
	if f, err := Open(p, false, zerolog.Nop()); err != nil || f.Restored().Instance == nil || len(f.Restored().Writers) != 1 {
		t.Errorf("Open(whole) restored %+v, %v; want the drain and the writer", f.Restored(), err)
	}
	var none *File
	if f, err := Open("", false, zerolog.Nop()); f != none || err != nil {
		t.Errorf("Open(\"\") = %v, %v; want nil, nil", f, err)
	}
	none.Changed()
	none.StopWriting()
	none.Restore(nil)
	none.Run(context.Background(), nil)
}

// TestRun: Run writes the file after Changed, and nothing after
// StopWriting, not even as it ends.
func TestRun(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	f, err := Open(p, false, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	st, ok := State{}, false
	collect := func() (State, bool) { mu.Lock(); defer mu.Unlock(); return st, ok }
	set := func(by string) {
		mu.Lock()
		st, ok = State{Instance: &Drain{By: by}}, true
		mu.Unlock()
		f.Changed()
	}
	read := func() string {
		got, err := Read(p)
		if err != nil || got.Instance == nil {
			return ""
		}
		return got.Instance.By
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx, collect); close(done) }() // exits when cancel is called
	f.Changed()                                      // nothing to collect yet
	set("a")
	testkit.WaitFor(t, 10*time.Second, func() error { // the writer gives no event but the file
		if got := read(); got != "a" {
			return fmt.Errorf("the state file says %q after Changed; want a", got)
		}
		return nil
	})
	f.StopWriting()
	set("b")
	cancel()
	<-done
	if got := read(); got != "a" {
		t.Errorf("after StopWriting the file says %q; want a", got)
	}
}
