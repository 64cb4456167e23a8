package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCheckShowsLoops: -check prints the event loops the daemon would run
// and where the count comes from: [process] loops, then $GOMAXPROCS, then
// one per CPU of the affinity mask (taskset) and the cgroup's quota.
func TestCheckShowsLoops(t *testing.T) {
	const svc = "\n[services.pg]\nlisten = [\"127.0.0.1:15432\"]\nbackends = [{ address = \"127.0.0.1:5432\" }]\n"
	set := writeFile(t, "set.toml", "[process]\nloops = 3\n"+svc)
	auto := writeFile(t, "auto.toml", svc)
	env := func(extra ...string) []string {
		var out []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GOMAXPROCS=") {
				out = append(out, kv)
			}
		}
		return append(out, extra...)
	}
	cases := []struct {
		name string
		cmd  []string
		env  []string
		want string
	}{
		{"the file", []string{bin, "-check", "-config", set}, env("GOMAXPROCS=5"), "process: 3 event loops ([process] loops)\n"},
		{"$GOMAXPROCS", []string{bin, "-check", "-config", auto}, env("GOMAXPROCS=5"), "process: 5 event loops ($GOMAXPROCS)\n"},
	}
	if _, err := exec.LookPath("taskset"); err == nil {
		cases = append(cases, struct {
			name string
			cmd  []string
			env  []string
			want string
		}{"the affinity mask", []string{"taskset", "-c", "0", bin, "-check", "-config", auto}, env(),
			"process: 1 event loop (one per CPU the process may use: 1 in the affinity mask, "})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := exec.Command(c.cmd[0], c.cmd[1:]...)
			cmd.Env, cmd.Stdout, cmd.Stderr = c.env, &out, &errOut
			if err := cmd.Run(); err != nil {
				t.Fatalf("%q: %v; stderr:\n%s", c.cmd, err, errOut.String())
			}
			if !strings.Contains(out.String(), c.want) {
				t.Errorf("%q printed\n%s\nwant a line %q", c.cmd, out.String(), c.want)
			}
		})
	}

	bad := writeFile(t, "bad.toml", "[process]\nloops = -2\n"+svc)
	var out, errOut bytes.Buffer
	if code := cli([]string{"-check", "-config", bad}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "process.loops: must not be negative, have -2") {
		t.Errorf("-check with loops = -2 = %d, stderr %q; want 1 and the key's error", code, errOut.String())
	}
}
