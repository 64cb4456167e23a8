package e2e

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	good := writeFile(t, "good.toml", `
[services.pg]
listen = ["127.0.0.1:15432"]
scheduler = "lc"
  [[services.pg.backends]]
  name = "pg-a"
  address = "127.0.0.1:5432"
  weight = 3
  [[services.pg.backends]]
  name = "pg-b"
  address = "127.0.0.1:5433"
  weight = 0
`)
	var out, errOut bytes.Buffer
	if code := cli([]string{"-check", "-config", good}, &out, &errOut); code != 0 {
		t.Fatalf("-check good = %d; stderr:\n%s", code, errOut.String())
	}
	for _, want := range []string{"configuration is valid", "service pg", "scheduler lc", "listen 127.0.0.1:15432",
		"pg-a", "127.0.0.1:5432", "3", "pg-b", "0 (drain)", "connect_timeout 3s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}

	bad := writeFile(t, "bad.toml", `
[services.pg]
listen = ["127.0.0.1:15432"]
scheduler = "wlcx"
  [[services.pg.backends]]
  address = "127.0.0.1:5432"
  weight = -3
`)
	out.Reset()
	errOut.Reset()
	if code := cli([]string{"-check", "-config", bad}, &out, &errOut); code != 1 {
		t.Fatalf("-check bad = %d; want 1", code)
	}
	for _, want := range []string{bad + ":4: services.pg.scheduler:", bad + ":7: services.pg.backends[0].weight: must not be negative"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("errors lack %q:\n%s", want, errOut.String())
		}
	}
	if code := cli([]string{"-check", "-config", filepath.Join(t.TempDir(), "none.toml")}, &out, &errOut); code != 1 {
		t.Errorf("-check on a missing file = %d; want 1", code)
	}
}

// TestHelp: -h and --help are a request, not a mistake: usage on stdout, exit 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"status", "-h"}, {"drain", "--help"}, {"healthz", "-h"}, {"demo", "-h"}} {
		var out, errOut bytes.Buffer
		if code := cli(args, &out, &errOut); code != 0 {
			t.Errorf("%v = %d; want 0", args, code)
		}
		if !strings.HasPrefix(out.String(), "usage: fulcrum") || errOut.Len() != 0 {
			t.Errorf("%v: stdout %q, stderr %q; want usage on stdout only", args, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := cli([]string{"-nosuchflag"}, &out, &errOut); code != 2 {
		t.Errorf("-nosuchflag = %d; want 2", code)
	}
	if out.Len() != 0 || !strings.Contains(errOut.String(), "-nosuchflag") || !strings.Contains(errOut.String(), "usage: fulcrum") {
		t.Errorf("-nosuchflag: stdout %q, stderr %q; want the error and usage on stderr", out.String(), errOut.String())
	}
}

// TestCheckQuiet: -check -q is for units' ExecStartPre= and ExecReload=,
// which put everything printed into the journal.
func TestCheckQuiet(t *testing.T) {
	good := writeFile(t, "good.toml", "[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\" }]\n")
	var out, errOut bytes.Buffer
	if code := cli([]string{"-check", "-q", "-config", good}, &out, &errOut); code != 0 || out.Len() != 0 || errOut.Len() != 0 {
		t.Errorf("-check -q on a valid file = %d, stdout %q, stderr %q; want 0 and nothing", code, out.String(), errOut.String())
	}
	// A file others may write is valid but unsafe: -check says so, -q does not.
	if err := os.Chmod(good, 0o666); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := cli([]string{"-check", "-config", good}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "warning: "+good+" is writable by others") {
		t.Errorf("-check on a 0666 file = %d, stderr %q; want 0 and a warning", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := cli([]string{"-check", "-q", "-config", good}, &out, &errOut); code != 0 || out.Len()+errOut.Len() != 0 {
		t.Errorf("-check -q on a 0666 file = %d, stdout %q, stderr %q; want 0 and nothing", code, out.String(), errOut.String())
	}
	bad := writeFile(t, "bad.toml", "[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\", wieght = 2 }]\n")
	if code := cli([]string{"-check", "-q", "-config", bad}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `did you mean "weight"`) {
		t.Errorf("-check -q on an invalid file = %d, stderr %q; want 1 and the problem", code, errOut.String())
	}
}

// TestMissingConfig: no file is not an invalid file; say what to do.
func TestMissingConfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fulcrum.toml")
	for _, args := range [][]string{{"-config", missing}, {"-check", "-config", missing}, {"status", "-config", missing}} {
		var errOut bytes.Buffer
		if code := cli(args, io.Discard, &errOut); code != 1 {
			t.Errorf("%v = %d; want 1", args, code)
		}
		for _, want := range []string{"no configuration at " + missing, "-config FILE", "fulcrum demo"} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("%v: %q lacks %q", args, errOut.String(), want)
			}
		}
		if strings.Contains(errOut.String(), "invalid") {
			t.Errorf("%v: %q calls a missing file invalid", args, errOut.String())
		}
	}
}

// TestAdminUnreachable: nothing listening at the admin address says what
// to check, including an [admin] listen changed since the daemon started.
func TestAdminUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	for _, cmd := range []string{"status", "drain", "healthz"} {
		var errOut bytes.Buffer
		if code := cli([]string{cmd, "-admin", addr}, io.Discard, &errOut); code != 1 {
			t.Errorf("%s against a closed port = %d; want 1", cmd, code)
		}
		if !strings.Contains(errOut.String(), "connection refused") || !strings.Contains(errOut.String(), "is fulcrum running?") {
			t.Errorf("%s: %q; want the refusal and what to check", cmd, errOut.String())
		}
	}
}
