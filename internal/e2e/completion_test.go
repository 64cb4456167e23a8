package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestCompletion holds the shell completions to the flags each command
// really has (read from its -h), so that a new flag cannot be missed, and
// runs the bash one.
func TestCompletion(t *testing.T) {
	bash, err := os.ReadFile("../../completion/fulcrum.bash")
	if err != nil {
		t.Fatal(err)
	}
	zsh, err := os.ReadFile("../../completion/_fulcrum")
	if err != nil {
		t.Fatal(err)
	}
	bashFlags := map[string]string{} // command ("*" for none) → its flags line
	for _, m := range regexp.MustCompile(`(?m)^\s*(\w+|\*)\) flags='([^']*)'`).FindAllStringSubmatch(string(bash), -1) {
		bashFlags[m[1]] = " " + m[2] + " "
	}
	flagLine := regexp.MustCompile(`(?m)^  -(\w+)`)
	for _, cmd := range []string{"", "status", "drain", "set", "healthz", "upgrade", "demo"} {
		args := []string{"-h"}
		key := "*"
		if cmd != "" {
			args, key = []string{cmd, "-h"}, cmd
		}
		var usage bytes.Buffer
		if code := cli(args, &usage, &usage); code != 0 {
			t.Fatalf("%v = %d", args, code)
		}
		flags := flagLine.FindAllStringSubmatch(usage.String(), -1)
		if len(flags) == 0 {
			t.Fatalf("%v printed no flags:\n%s", args, usage.String())
		}
		for _, f := range flags {
			if !strings.Contains(bashFlags[key], " -"+f[1]+" ") {
				t.Errorf("completion/fulcrum.bash: %s) lacks -%s", key, f[1])
			}
			if !strings.Contains(string(zsh), "'-"+f[1]+"[") {
				t.Errorf("completion/_fulcrum lacks -%s", f[1])
			}
		}
		if cmd != "" && !strings.Contains(string(bash), "status drain set healthz upgrade demo version") {
			t.Errorf("completion/fulcrum.bash does not offer the commands")
		}
	}

	sh := needProgram(t, "bash")
	for line, want := range map[string]string{
		"fulcrum st":         "status",
		"fulcrum status -j":  "-json",
		"fulcrum -ch":        "-check",
		"fulcrum drain -u":   "-undo",
		"fulcrum ver":        "version",
		"fulcrum se":         "set",
		"fulcrum set pg/a m": "maint",
	} {
		script := `source ../../completion/fulcrum.bash
COMP_WORDS=(` + line + ` ); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _fulcrum; echo "${COMPREPLY[*]}"`
		out, err := exec.Command(sh, "-c", script).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("bash completion of %q = %q, %v; want %q", line, out, err, want)
		}
	}
}
