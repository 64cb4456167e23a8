package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestStateFileIsConfig: a state_file naming the configuration itself, or
// someone else's file, is refused with a located error by -check and at
// start, and neither file is touched. Before, -check called it valid and the
// first start replaced the configuration with JSON (issue 30).
func TestStateFileIsConfig(t *testing.T) {
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fulcrum.toml")
	other := filepath.Join(dir, "passwd.copy")
	mine := "root:x:0:0:root:/root:/bin/bash\n"
	if err := os.WriteFile(other, []byte(mine), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, state, want string }{
		{"the configuration", cfgPath, "fulcrum.toml:4: admin.state_file: " + cfgPath + " is this configuration file"},
		{"someone else's file", other, "fulcrum.toml:4: admin.state_file: " + other + " exists and is not a state file of fulcrum's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := fmt.Sprintf("[log]\nformat = \"json\"\n[admin]\nstate_file = %q\n[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = %q }]\n", c.state, be)
			if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			if code := cli([]string{"-check", "-q", "-config", cfgPath}, &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
				t.Errorf("-check = %d, %q; want 1 and %q", code, errb.String(), c.want)
			}
			errb.Reset()
			if code := cli([]string{"-config", cfgPath}, &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
				t.Errorf("start = %d, %q; want 1 and %q", code, errb.String(), c.want)
			}
			if b, _ := os.ReadFile(cfgPath); string(b) != text {
				t.Errorf("the configuration became %q", b)
			}
			if b, _ := os.ReadFile(other); string(b) != mine {
				t.Errorf("the other file became %q", b)
			}
		})
	}
}

// TestDamagedStateFile: a state file cut short (it held an instance drain
// and a maint override) stops the start by default, with an error that
// says what to do, and is left as it was; with state_damaged =
// "start-empty" the daemon keeps it aside under a new name, says so at
// error level, and starts without it. Before, it warned, started with
// neither and overwrote the file at once (issue 30).
func TestDamagedStateFile(t *testing.T) {
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	whole := fmt.Sprintf(`{
  "fulcrum_state": 1,
  "saved": "2026-12-01T22:32:53Z",
  "instance_drain": {"by": "SIGUSR1", "since": "2026-12-01T22:30:00Z"},
  "backends": [{"service": "s", "backend": %q, "override": "maint", "by": "fulcrum set"}]
}
`, be)
	cut := whole[:len(whole)/2]
	if err := os.WriteFile(state, []byte(cut), 0o600); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("[log]\nformat = \"json\"\n[admin]\nlisten = \"127.0.0.1:0\"\nstate_file = %q\n%%s[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = %q }]\n", state, be)

	d := startDaemon(t, fmt.Sprintf(text, ""))
	line := d.awaitPrefix(t, "cannot start: the state file is damaged")
	if line["level"] != "error" || !strings.Contains(fmt.Sprint(line["message"]), `state_damaged = "start-empty"`) {
		t.Errorf("refusal line %v; want an error naming state_damaged", line)
	}
	select {
	case <-d.exit:
		if d.err == nil {
			t.Error("the daemon exited 0; want 1")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not exit within 10s of refusing the damaged state file")
	}
	if b, _ := os.ReadFile(state); string(b) != cut {
		t.Fatalf("the damaged file became %q; want it left as it was", b)
	}

	d = startDaemon(t, fmt.Sprintf(text, "state_damaged = \"start-empty\"\n"))
	line = d.awaitPrefix(t, "the state file is damaged: kept aside")
	aside, _ := line["kept_as"].(string)
	if line["level"] != "error" || !strings.HasPrefix(aside, state+".damaged-") {
		t.Fatalf("kept-aside line %v; want an error naming the new name", line)
	}
	if b, err := os.ReadFile(aside); err != nil || string(b) != cut {
		t.Errorf("kept aside: %q, %v; want the damaged bytes", b, err)
	}
	adm := d.adminAddr(t)
	if name, err := testkit.Greeting(d.listenAddr(t)); err != nil || name != "a" {
		t.Errorf("started without the state: %q, %v; want served", name, err)
	}
	if code, body := get(t, adm, "/healthz"); code != 200 {
		t.Errorf("/healthz = %d %q; want 200, no drain restored", code, body)
	}
}
