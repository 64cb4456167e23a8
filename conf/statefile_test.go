package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStateFileRefused: a state_file that names the configuration itself
// (directly or through a link), a password_file, or an existing file that
// is not fulcrum's state is a located error: fulcrum would overwrite it.
// A state file fulcrum wrote (this release's header or an earlier one's),
// an empty one and a missing one are fine.
func TestStateFileRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfgPath := filepath.Join(dir, "fulcrum.toml")
	link := filepath.Join(dir, "link.toml")
	if err := os.Symlink(cfgPath, link); err != nil {
		t.Fatal(err)
	}
	pw := write("pw", "secret\n")
	passwd := write("passwd.copy", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n")
	current := write("state.json", "{\n  \"fulcrum_state\": 1,\n  \"saved\": \"2026-12-01T22:32:53Z\"\n}\n")
	earlier := write("old.json", "{\n  \"saved\": \"2026-12-01T22:32:53Z\",\n  \"backends\": []\n}\n")
	damaged := write("cut.json", "{\n  \"fulcrum_state\": 1,\n  \"saved\": \"2026-12-0")
	empty := write("empty.json", "")
	tests := []struct {
		name, stateFile, want string // want "" means valid
	}{
		{"the configuration", cfgPath, "fulcrum.toml:2: admin.state_file: " + cfgPath + " is this configuration file"},
		{"a link to the configuration", link, "admin.state_file: " + link + " is this configuration file"},
		{"a password file", pw, "admin.state_file: " + pw + " is the password_file of services.s backend b"},
		{"someone else's file", passwd, "fulcrum.toml:2: admin.state_file: " + passwd + " exists and is not a state file of fulcrum's"},
		{"a directory", dir, "admin.state_file: " + dir + " exists and is not a regular file"},
		{"this release's state", current, ""},
		{"an earlier release's state", earlier, ""},
		{"a damaged state (for the start to judge)", damaged, ""},
		{"an empty file", empty, ""},
		{"missing", filepath.Join(dir, "new.json"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := "[admin]\nstate_file = \"" + tt.stateFile + "\"\n[services.s]\nlisten = [\"127.0.0.1:7001\"]\n" +
				"backends = [{name = \"b\", address = \"127.0.0.1:7002\", health = {check = \"pgsql\", password_file = \"" + pw + "\"}}]\n"
			if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(cfgPath)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Load = %v; want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Load = %v; want %q", err, tt.want)
			}
		})
	}
	if b, _ := os.ReadFile(passwd); !strings.HasPrefix(string(b), "root:x:0:0") {
		t.Errorf("the refused file was changed: %q", b)
	}
}

// TestStateDamagedKey: state_damaged takes "refuse" (the default) or
// "start-empty".
func TestStateDamagedKey(t *testing.T) {
	base := "[services.s]\nlisten = [\"127.0.0.1:7001\"]\nbackends = [{address = \"127.0.0.1:7002\"}]\n"
	cfg, err := Parse("f.toml", []byte(base))
	if err != nil || cfg.Admin.StateDamaged != "refuse" {
		t.Fatalf("default: %v, %q; want refuse", err, cfg.Admin.StateDamaged)
	}
	cfg, err = Parse("f.toml", []byte("[admin]\nstate_damaged = \"start-empty\"\n"+base))
	if err != nil || cfg.Admin.StateDamaged != "start-empty" {
		t.Fatalf("start-empty: %v, %+v", err, cfg.Admin)
	}
	if _, err := Parse("f.toml", []byte("[admin]\nstate_damaged = \"ignore\"\n"+base)); err == nil || !strings.Contains(err.Error(), "f.toml:2: admin.state_damaged:") {
		t.Errorf("state_damaged = \"ignore\": %v; want a located error", err)
	}
}
