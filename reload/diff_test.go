package reload

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"fulcrum/conf"
)

// TestSettingChanges: the reload report names every changed setting, not
// only backend changes, with the file's key names.
func TestSettingChanges(t *testing.T) {
	parse := func(text string) *conf.Config {
		t.Helper()
		cfg, err := conf.Parse("t.toml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	old := parse(`[log]
level = "info"
[services.pg]
listen = ["127.0.0.1:1"]
drain_timeout = "30s"
backends = [{ name = "a", address = "127.0.0.1:2" }]
`)
	next := parse(`[log]
level = "debug"
[services.pg]
listen = ["127.0.0.1:1"]
drain_timeout = "3s"
max_conns = 10
backends = [{ name = "a", address = "127.0.0.1:2", weight = 3, max_conns = 5 }, { name = "b", address = "127.0.0.1:3" }]
`)
	got := settingChanges(old, next)
	for _, want := range []string{"log.level info→debug", "services.pg.drain_timeout 30s→3s", "services.pg.max_conns 0→10", "services.pg.backends.a.max_conns 0→5"} {
		if !slices.Contains(got, want) {
			t.Errorf("settingChanges = %q; lacks %q", got, want)
		}
	}
	for _, s := range got {
		if s == "services.pg.backends.a.weight 1→3" || s == "services.pg.backends.b" {
			t.Errorf("settingChanges = %q; weights and membership have their own lists", got)
		}
	}
	if got := settingChanges(old, old); len(got) != 0 {
		t.Errorf("unchanged file: %q; want nothing", got)
	}
}

// TestReloadLineSays: the reload line names its trigger (an inotify event,
// SIGHUP) and every changed setting; a file whose configuration did not
// change says unchanged.
func TestReloadLineSays(t *testing.T) {
	text := func(drain string) string {
		return render(svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: "drain_timeout = \"" + drain + "\"",
			backends: []be{{name: "a", addr: "127.0.0.1:9", weight: 1}}})
	}
	r := startRun(t, t.TempDir(), text("30s"))
	applied := func(gen float64) map[string]any {
		return r.logs.Wait(t, 5*time.Second, "reload applied", func(m map[string]any) bool {
			return m["message"] == "reload applied" && m["generation"] == gen
		})
	}
	renameOver(t, r.path, text("3s"))
	line := applied(2)
	if line["trigger"] != "file" || !strings.Contains(fmt.Sprint(line["settings"]), "services.s.drain_timeout 30s→3s") {
		t.Errorf("file reload line %v; want trigger file and the drain_timeout change", line)
	}
	renameOver(t, r.path, text("3s")+"# a comment\n")
	if line = applied(3); line["trigger"] != "file" || line["unchanged"] != true {
		t.Errorf("comment-only reload line %v; want trigger file, unchanged", line)
	}
	r.hup <- struct{}{}
	if line = applied(4); line["trigger"] != "sighup" || line["unchanged"] != true {
		t.Errorf("SIGHUP reload line %v; want trigger sighup, unchanged", line)
	}
	if line["component"] != "reload" {
		t.Errorf("component %v; want reload", line["component"])
	}
}
