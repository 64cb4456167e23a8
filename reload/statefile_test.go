package reload

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadStateDamaged: a state file that exists but is not a whole state
// is ErrDamaged (never an empty state that the first save would write over);
// a missing or empty one is an empty state; SetAside keeps a damaged one
// under a new name.
func TestReadStateDamaged(t *testing.T) {
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
		st, err := ReadState(p)
		if errors.Is(err, ErrDamaged) != c.damaged {
			t.Errorf("%s: ReadState = %v; want damaged %v", c.name, err, c.damaged)
		}
		if c.name == "whole" && (st.Instance == nil || st.Instance.By != "SIGUSR1") {
			t.Errorf("whole: %+v; want the drain", st)
		}
	}
	if _, err := ReadState(filepath.Join(dir, "missing.json")); err != nil {
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
