package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"fulcrum/admin"
	"fulcrum/internal/testkit"
)

// wantHealthz checks what /healthz answers, and that fulcrum healthz says
// the same.
func wantHealthz(t *testing.T, adm string, code int, prefix string) {
	t.Helper()
	got, body := get(t, adm, "/healthz")
	if got != code || !strings.HasPrefix(body, prefix) || strings.Count(body, "\n") != 1 {
		t.Errorf("/healthz = %d %q; want %d and one line starting %q", got, body, code, prefix)
	}
	var out strings.Builder
	exit := cli([]string{"healthz", "-admin", adm}, &out, io.Discard)
	if want := map[bool]int{true: 0, false: 1}[code == 200]; exit != want || out.String() != body {
		t.Errorf("fulcrum healthz = %d, %q; want %d, %q", exit, out.String(), want, body)
	}
}

// TestDrainInstance drives the real daemon through every way in and out of
// rotation — fulcrum drain, SIGUSR1/SIGUSR2, shutdown — and checks that
// /healthz flips while connections are still served, that /status,
// /metrics and `fulcrum status` show it, and that each flip is logged once.
func TestDrainInstance(t *testing.T) {
	be := testkit.NewServer(t, testkit.Greeter("a")).Addr
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.s]
listen = ["127.0.0.1:0"]
drain_timeout = "1m"
backends = [{ name = "a", address = %q }]
`, be))
	adm := d.adminAddr(t)
	lb := d.listenAddr(t)
	wantHealthz(t, adm, 200, "ok")

	drain := func(want string, args ...string) {
		t.Helper()
		var out, errOut strings.Builder
		if code := cli(append([]string{"drain", "-admin", adm}, args...), &out, &errOut); code != 0 {
			t.Fatalf("fulcrum drain %v = %d: %s", args, code, errOut.String())
		}
		if !strings.HasPrefix(out.String(), want) {
			t.Errorf("fulcrum drain %v printed %q; want %q…", args, out.String(), want)
		}
	}
	drain("draining; /healthz: draining since ")
	if by := d.await(t, logDraining)["by"].(string); !strings.HasPrefix(by, "POST /drain from 127.0.0.1:") {
		t.Errorf("drained by %q", by)
	}
	wantHealthz(t, adm, 503, "draining since ")
	if got := greet(t, lb); got != "a" {
		t.Errorf("a new connection while draining reached %q; want a", got)
	}
	drain("already draining")

	_, body := get(t, adm, "/status")
	var st admin.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if is := st.Instance; is == nil || !is.Draining || is.Healthy || !strings.HasPrefix(is.By, "POST /drain") {
		t.Errorf("/status instance = %+v; want draining, unhealthy, by POST /drain", is)
	}
	_, metrics := get(t, adm, "/metrics")
	for _, want := range []string{"\nfulcrum_instance_draining 1\n", "\nfulcrum_instance_healthy 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	var table strings.Builder
	if code := cli([]string{"status", "-admin", adm}, &table, io.Discard); code != 0 || !strings.Contains(table.String(), "instance unhealthy: draining since") {
		t.Errorf("fulcrum status = %d:\n%s", code, table.String())
	}

	drain("undrained; /healthz: ok", "-undo")
	d.await(t, logUndrained, logDraining) // the second drain request logged nothing
	wantHealthz(t, adm, 200, "ok")
	drain("not draining", "-undo")

	// A cross-origin browser request must not drain the instance.
	req, _ := http.NewRequest("POST", "http://"+adm+"/drain", nil)
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin POST /drain = %d; want 403", resp.StatusCode)
	}
	wantHealthz(t, adm, 200, "ok")

	d.cmd.Process.Signal(syscall.SIGUSR1)
	if by := d.await(t, logDraining, logUndrained)["by"]; by != "SIGUSR1" {
		t.Errorf("drained by %v; want SIGUSR1", by)
	}
	wantHealthz(t, adm, 503, "draining since ")
	d.cmd.Process.Signal(syscall.SIGUSR2)
	d.await(t, logUndrained, logDraining)
	wantHealthz(t, adm, 200, "ok")

	// Shutdown: while an open connection holds the drain, /healthz fails.
	c, err := net.DialTimeout("tcp", lb, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.await(t, logStopping, logUndrained)
	wantHealthz(t, adm, 503, "stopping")
	var out, errOut strings.Builder
	if code := cli([]string{"drain", "-undo", "-admin", adm}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "already draining") {
		t.Errorf("drain -undo while stopping = %d %q %q; want already draining", code, out.String(), errOut.String())
	}
	c.Close()
	select {
	case <-d.exit:
		if d.err != nil {
			t.Errorf("exit: %v; want 0", d.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the last connection closed")
	}
}

// TestHealthzBackendsDown: with every backend down the instance asks to
// be taken out of rotation, without any drain.
func TestHealthzBackendsDown(t *testing.T) {
	d := startDaemon(t, fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
[services.s]
listen = ["127.0.0.1:0"]
backends = [{ name = "dead", address = %q, health = { check = "tcp", interval = "100ms", timeout = "100ms", fall = 1 } }]
`, testkit.DeadAddr(t)))
	adm := d.adminAddr(t)
	d.await(t, "backend down")
	wantHealthz(t, adm, 503, "no service has a backend up: s 0/1")
}

// TestDrainWithoutAdmin: fulcrum drain needs an admin address.
func TestDrainWithoutAdmin(t *testing.T) {
	path := writeFile(t, "f.toml", "[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = \"127.0.0.1:1\" }]\n")
	var errOut strings.Builder
	if code := cli([]string{"drain", "-config", path}, io.Discard, &errOut); code != 1 || !strings.Contains(errOut.String(), "has no [admin] listen") {
		t.Errorf("drain = %d, %q; want 1 and a hint", code, errOut.String())
	}
}
