package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"fulcrum/internal/testkit"
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
COMP_LINE="` + line + `"; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(` + line + ` ); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _fulcrum; echo "${COMPREPLY[*]}"`
		out, err := exec.Command(sh, "-c", script).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("bash completion of %q = %q, %v; want %q", line, out, err, want)
		}
	}
}

// TestCompletionNames: in an interactive bash on a terminal, with the
// completion file sourced and this build as `fulcrum` on PATH, `fulcrum
// set` completes the running daemon's SERVICE/BACKEND names, asked through
// -admin (an address bash itself splits at ':') or -config, then the
// states. It is the shell's own word splitting and readline that run here,
// against a real daemon.
func TestCompletionNames(t *testing.T) {
	sh := needProgram(t, "bash")
	a := testkit.NewServer(t, testkit.Greeter("a"))
	config := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = %q
[services.ro]
listen   = ["127.0.0.1:0"]
backends = [{ name = "pg2", address = %q }, { name = "pg3", address = %q }]
[services.rw]
listen   = ["127.0.0.2:0"]
backends = [{ name = "pg1", address = %q }]
`, testkit.FreeAddr(t), a.Addr, a.Addr, a.Addr))
	d := startDaemonArgs(t, []string{"-config", config}, nil, nil)
	adm := d.adminAddr(t)

	term := startBash(t, sh)
	for _, c := range []struct {
		typed  string // then a tab
		listed string // the candidates it lists; "": none
		line   string // the command line after it
	}{
		{"fulcrum set -admin " + adm + " r", "ro/pg2  ro/pg3  rw/pg1", "fulcrum set -admin " + adm + " r"},
		{"fulcrum set -admin " + adm + " rw", "", "fulcrum set -admin " + adm + " rw/pg1 "},
		{"fulcrum set -config " + config + " ro/pg", "ro/pg2  ro/pg3", "fulcrum set -config " + config + " ro/pg"},
		{"fulcrum set -admin " + adm + " ro/pg3 m", "", "fulcrum set -admin " + adm + " ro/pg3 maint "},
		{"fulcrum set -admin 127.0.0.1:9 r", "", "fulcrum set -admin 127.0.0.1:9 r"}, // nothing answers: nothing offered
	} {
		term.send(t, c.typed+"\t")
		if c.listed != "" {
			term.await(t, "\n"+c.listed)
		}
		// The line as it stands, printed in capitals, which the terminal's
		// echo of what is typed never shows: Ctrl-A, echo, Ctrl-E, Enter.
		term.send(t, "\x01echo '<\x05>' | tr a-z A-Z\n")
		term.await(t, "\n<"+strings.ToUpper(c.line)+">\n$ ")
	}
}

// terminal is an interactive bash on a pseudo-terminal, and what it wrote.
type terminal struct {
	master *os.File
	out    chan []byte // chunks read from the terminal; closed when bash is gone
	seen   []byte      // read so far, since the last await's match
}

// startBash runs bash interactively on a new pseudo-terminal, with
// fulcrum's completion sourced, this build's directory first on PATH and
// "$ " as its prompt. The test's cleanup ends it.
func startBash(t *testing.T, sh string) *terminal {
	t.Helper()
	master, slave := testkit.OpenPTY(t, 50, 250)
	completion, err := filepath.Abs("../../completion/fulcrum.bash")
	if err != nil {
		t.Fatal(err)
	}
	rc := writeFile(t, "bashrc", "source "+completion+"\n"+
		"bind 'set enable-bracketed-paste off'\nbind 'set bell-style none'\nbind 'set show-all-if-ambiguous on'\n"+
		"bind 'set completion-query-items 0'\nbind 'set page-completions off'\nPS1='$ '\n")
	cmd := exec.Command(sh, "--noprofile", "--rcfile", rc, "-i")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "TERM=dumb", "HISTFILE=/dev/null")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	term := &terminal{master: master, out: make(chan []byte, 64)}
	go func() { // exits when bash is gone and the terminal reads EIO
		defer close(term.out)
		for {
			b := make([]byte, 4096)
			n, err := master.Read(b)
			if n > 0 {
				term.out <- b[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		master.Close()
		for range term.out { // the reader ends once the terminal is closed
		}
	})
	term.await(t, "$ ")
	return term
}

// send types s on the terminal.
func (term *terminal) send(t *testing.T, s string) {
	t.Helper()
	if _, err := term.master.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// await waits until the terminal has shown want since the last match,
// and forgets what came before its end.
func (term *terminal) await(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if i := bytes.Index(term.seen, []byte(want)); i >= 0 {
			term.seen = term.seen[i+len(want):]
			return
		}
		select {
		case b, ok := <-term.out:
			if !ok {
				t.Fatalf("bash ended before showing %q; it showed %q", want, term.seen)
			}
			term.seen = append(term.seen, bytes.ReplaceAll(b, []byte("\r"), nil)...)
		case <-deadline:
			t.Fatalf("bash did not show %q within 15s; it showed %q", want, term.seen)
		}
	}
}
