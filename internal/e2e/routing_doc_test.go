package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"fulcrum/conf"
)

// docBlocks returns the fenced blocks of language lang in a doc file.
func docBlocks(t *testing.T, path, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("no %s block in %s", lang, path)
	}
	return out
}

// TestRoutingDoc: the configurations docs/routing.md shows side by side
// are valid for fulcrum, nginx and HAProxy alike.
func TestRoutingDoc(t *testing.T) {
	const doc = "../../docs/routing.md"
	for i, src := range docBlocks(t, doc, "toml") {
		cfg, err := conf.Parse(doc, []byte(src))
		if err != nil {
			t.Errorf("toml block %d: %v", i, err)
			continue
		}
		a := cfg.Services[0].Listen[0]
		if cfg.Routed()[a] == nil {
			t.Errorf("toml block %d: %s is not routed by name", i, a)
		}
	}

	t.Run("nginx", func(t *testing.T) {
		nginx := needProgram(t, "nginx")
		dir := t.TempDir()
		for i, src := range docBlocks(t, doc, "nginx") {
			path := filepath.Join(dir, "nginx.conf")
			head := "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\npid " + dir + "/nginx.pid;\nerror_log " + dir + "/error.log;\nevents {}\n"
			if err := os.WriteFile(path, []byte(head+src), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(nginx, "-t", "-q", "-p", dir, "-e", dir+"/error.log", "-c", path).CombinedOutput()
			if err != nil {
				t.Errorf("nginx -t on block %d: %v\n%s", i, err, out)
			}
		}
	})
	t.Run("haproxy", func(t *testing.T) {
		haproxy := needProgram(t, "haproxy")
		for i, src := range docBlocks(t, doc, "haproxy") {
			path := filepath.Join(t.TempDir(), "haproxy.cfg")
			if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(haproxy, "-c", "-f", path).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Configuration file is valid") {
				t.Errorf("haproxy -c on block %d: %v\n%s", i, err, out)
			}
		}
	})
}
