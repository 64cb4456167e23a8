package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// TestStalledLogReader: with standard error a pipe that nobody reads (a
// stalled journald, a stuck log shipper), the daemon serves on: far more
// short connections than its connection limit and the pipe together hold
// are served one after another, the lines that did not fit are counted in
// fulcrum_log_dropped_total and said by /healthz (still 200), and once the
// pipe is read again the log says how many were dropped (issue 24). Before,
// every finished connection waited in its access line holding its slot, and
// the daemon stopped after about limit + a pipeful of connections.
func TestStalledLogReader(t *testing.T) {
	be := testkit.NewServer(t, testkit.Greeter("hi")).Addr
	adm, addr := testkit.FreeAddr(t), testkit.FreeAddr(t) // ports below the ephemeral range: fulcrum's own dials cannot take them first
	path := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
access = true
[admin]
listen = %q
[services.s]
listen = [%q]
backends = [{ address = %q }]
`, adm, addr, be))
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	const nofile = 300 // a limit of (300 - 128) / 2 = 86 connections
	cmd := exec.Command("prlimit", fmt.Sprintf("--nofile=%d", nofile), bin, "-config", path)
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close() // the daemon holds the only write end; this test never reads it until told
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // exits with the daemon
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	testkit.WaitFor(t, 20*time.Second, func() error { // the daemon's stderr is not read here: no READY line to wait on
		_, err := testkit.Greeting(addr)
		return err
	})

	// The log's buffer holds 1 MiB, some 3,500 access lines, a pipe 64 KiB,
	// some 200; the limit 86 connections.
	const conns = 6000
	for i := range conns {
		if got, err := testkit.Greeting(addr); err != nil || got != "hi" {
			t.Fatalf("connection %d of %d: %q, %v; want every one served while the log is stalled", i+1, conns, got, err)
		}
	}
	code, body := get(t, adm, "/healthz")
	if code != 200 || !strings.Contains(body, "log output stalled: ") {
		t.Errorf("/healthz = %d %q; want 200 saying the log output is stalled", code, body)
	}
	_, m := get(t, adm, "/metrics")
	mm := regexp.MustCompile(`(?m)^fulcrum_log_dropped_total (\d+)$`).FindStringSubmatch(m)
	if mm == nil {
		t.Fatal("no fulcrum_log_dropped_total in /metrics")
	}
	dropped, _ := strconv.Atoi(mm[1])
	if dropped < conns/4 {
		t.Errorf("fulcrum_log_dropped_total = %d; want hundreds of the %d access lines", dropped, conns)
	}
	testkit.WaitFor(t, 10*time.Second, func() error { // a slot given back is no event outside the daemon
		_, m := get(t, adm, "/metrics")
		if n := regexp.MustCompile(`(?m)^fulcrum_connections (\d+)$`).FindStringSubmatch(m); n == nil || n[1] != "0" {
			return fmt.Errorf("fulcrum_connections = %v after the last client left; want 0, every slot given back", n)
		}
		return nil
	})

	// The reader comes back: the log says what it lost.
	found := make(chan int, 1)
	go func() { // exits at the daemon's exit, when the pipe closes
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) == nil && l["component"] == "log" && !sent {
				if n, ok := l["dropped"].(float64); ok && strings.HasPrefix(fmt.Sprint(l["message"]), "log output was stalled: ") {
					found <- int(n)
					sent = true
				}
			}
		}
	}()
	select {
	case n := <-found:
		if n <= 0 || n > dropped+10 { // a line or two more may have been dropped since /metrics
			t.Errorf("the log said %d lines dropped; want about %d", n, dropped)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no \"log output was stalled\" line within 10s of reading the log again")
	}
	if code, body := get(t, adm, "/healthz"); code != 200 || strings.Contains(body, "stalled") {
		t.Errorf("/healthz after the log is read = %d %q; want 200 and no stall", code, body)
	}
}
