package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeAdmin serves /status (generation 7), /healthz and POST /drain on
// loopback, as a running daemon's admin listener would, and returns its
// address.
func fakeAdmin(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"generation": 7, "services": [{"name": "ro", "backends": [{"name": "pg2"}, {"name": "pg3"}, {"name": "old", "removed": true}]}]}`))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("POST /drain", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("draining\n")) })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln) // exits when the cleanup closes the server
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestCommandsWithInvalidFile: the commands that ask the running daemon
// need only [admin] listen, so a file on disk that does not validate (a
// half-finished edit) or does not even parse does not stop them; they say
// that the running table ignores it, above their output.
func TestCommandsWithInvalidFile(t *testing.T) {
	addr := fakeAdmin(t)
	files := map[string]string{
		"invalid":     "[admin]\nlisten = \"" + addr + "\"\n\n[services.ro]\nlisten = [\"127.0.0.1:15433\"]\nscheduler = \"leastconn\"\n[[services.ro.backends]]\nname = \"a\"\naddress = \"127.0.0.1:5432\"\n",
		"unparseable": "[admin]\nlisten = \"" + addr + "\" # the admin listener\n\n[services.ro\nlisten = [\"127.0.0.1:15433\"\n",
	}
	for name, text := range files {
		path := filepath.Join(t.TempDir(), "fulcrum.toml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []struct {
			name string
			run  func([]string, *bytes.Buffer, *bytes.Buffer) int
			out  string
		}{
			{"healthz", func(a []string, o, e *bytes.Buffer) int { return healthz(a, o, e) }, "ok"},
			{"status", func(a []string, o, e *bytes.Buffer) int { return status(a, o, e) }, "generation 7"},
			{"drain", func(a []string, o, e *bytes.Buffer) int { return drain(a, o, e) }, "draining"},
		} {
			t.Run(name+"/"+cmd.name, func(t *testing.T) {
				var out, errb bytes.Buffer
				if code := cmd.run([]string{"-config", path}, &out, &errb); code != 0 {
					t.Fatalf("fulcrum %s with a file that is %s: exit %d; stderr %q", cmd.name, name, code, errb.String())
				}
				if !strings.Contains(out.String(), cmd.out) {
					t.Errorf("output %q; want %q in it", out.String(), cmd.out)
				}
				want := "fulcrum " + cmd.name + ": the file on disk is invalid; the running table 7 ignores it:"
				if !strings.HasPrefix(errb.String(), want) {
					t.Errorf("stderr %q; want it to begin %q", errb.String(), want)
				}
			})
		}
	}
	// Without a listen address it can read, it still says what is wrong.
	path := filepath.Join(t.TempDir(), "fulcrum.toml")
	os.WriteFile(path, []byte("[admin\nlisten = 9900\n"), 0o644)
	var out, errb bytes.Buffer
	if code := healthz([]string{"-config", path}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "configuration is invalid") {
		t.Errorf("healthz with no readable [admin] listen: exit %d, stderr %q; want 1 and the file's errors", code, errb.String())
	}
}

// TestSetList: fulcrum set -list prints the running daemon's names, for
// shell completion.
func TestSetList(t *testing.T) {
	addr := fakeAdmin(t)
	var out, errb bytes.Buffer
	if code := set([]string{"-list", "-admin", addr}, &out, &errb); code != 0 || out.String() != "ro/pg2\nro/pg3\n" {
		t.Errorf("set -list = %d, %q (stderr %q); want ro/pg2 and ro/pg3", code, out.String(), errb.String())
	}
}

// TestCheckWarns: -check says what is valid but most likely not meant,
// and -q keeps quiet about it.
func TestCheckWarns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fulcrum.toml")
	os.WriteFile(path, []byte("[services.ro]\nlisten = [\"127.0.0.1:15433\"]\nscheduler = \"lc\"\nbackends = [{ name = \"a\", address = \"127.0.0.1:5432\", weight = 3 }, { name = \"b\", address = \"127.0.0.2:5432\" }]\n"), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"-check", "-config", path}, &out, &errb); code != 0 {
		t.Fatalf("-check = %d: %s", code, errb.String())
	}
	if want := `fulcrum: warning: services.ro: scheduler "lc" ignores weights, and its backends have different weights (3, 1); use "wlc"`; !strings.Contains(errb.String(), want) {
		t.Errorf("-check stderr %q; want %q", errb.String(), want)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"-check", "-q", "-config", path}, &out, &errb); code != 0 || out.Len()+errb.Len() != 0 {
		t.Errorf("-check -q = %d, %q %q; want 0 and nothing", code, out.String(), errb.String())
	}
}

// TestStatusRefused: an admin listener that answers /status with an error
// (here the Host check's 421) is reported with its status and text, by
// every command that reads /status, not as JSON that did not parse.
func TestStatusRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `host "lb1" is not served here`, http.StatusMisdirectedRequest)
	})}
	go srv.Serve(ln) // exits when the cleanup closes the server
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	for _, args := range [][]string{{"status"}, {"status", "-json"}, {"set", "-list"}} {
		var out, errb bytes.Buffer
		code := run(append(args, "-admin", addr), &out, &errb)
		want := addr + "/status: 421 Misdirected Request: host \"lb1\" is not served here"
		if code != 1 || !strings.Contains(errb.String(), want) || out.Len() != 0 {
			t.Errorf("fulcrum %v = %d, stdout %q, stderr %q; want 1 and %q", args, code, out.String(), errb.String(), want)
		}
	}
}
