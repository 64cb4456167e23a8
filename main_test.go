package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/conf"
)

// The tests here reach main's unexported functions and variables (run's
// version output, newLogger, demo). Everything that runs the daemon or a
// command as a process is in internal/e2e.

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"-version"}, {"version"}} {
		var out bytes.Buffer
		if code := run(args, &out, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "fulcrum ") {
			t.Errorf("%v = %d, %q", args, code, out.String())
		}
		for _, want := range []string{"\ncommit: ", "\ngo: " + runtime.Version(), "\nbuilt: "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v printed %q; want %q in it", args, out.String(), want)
			}
		}
	}
	// What the Makefile stamps with -ldflags -X.
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3-4-gabcdef0", "abcdef0123456789", "2026-12-01T04:00:00Z"
	var out bytes.Buffer
	run([]string{"version"}, &out, io.Discard)
	want := "fulcrum v1.2.3-4-gabcdef0\ncommit: abcdef0123456789\ngo: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\nbuilt: 2026-12-01T04:00:00Z\n"
	if out.String() != want {
		t.Errorf("version = %q; want %q", out.String(), want)
	}
	if code := run([]string{"version", "extra"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("version extra = %d; want 2", code)
	}
}

// TestLogFormat: JSON times carry milliseconds; console lines carry no
// colour off a terminal.
func TestLogFormat(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(conf.Log{Level: "info", Format: "json"}, &buf)
	log.Info().Msg("hello")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if ts, _ := m["time"].(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$`).MatchString(ts) {
		t.Errorf("time %q; want RFC 3339 with milliseconds", ts)
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("time %q: %v", ts, err)
	}

	for _, format := range []conf.LogFormat{conf.LogConsole, conf.LogAuto} {
		buf.Reset()
		log = newLogger(conf.Log{Level: "info", Format: format}, &buf)
		log.Warn().Str("k", "v").Msg("hello")
		line := buf.String()
		if strings.Contains(line, "\x1b[") {
			t.Errorf("format %s off a terminal wrote colour: %q", format, line)
		}
		if format == "console" && !regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} WRN hello k=v\n$`).MatchString(line) {
			t.Errorf("console line %q; want date, time with milliseconds, level, message, fields", line)
		}
		if format == "auto" && json.Unmarshal([]byte(line), &m) != nil {
			t.Errorf("auto off a terminal wrote %q; want JSON", line)
		}
	}

	// The milliseconds are real, not a fixed .000: over lines logged across
	// more than a millisecond, the fraction changes.
	buf.Reset()
	log = newLogger(conf.Log{Level: "info", Format: "console"}, &buf)
	fractions := map[string]bool{}
	for deadline := time.Now().Add(5 * time.Second); len(fractions) < 2 && time.Now().Before(deadline); {
		buf.Reset()
		log.Info().Msg("x")
		fractions[buf.String()[20:23]] = true
		time.Sleep(time.Millisecond) // not for correctness: to let the clock move on
	}
	if len(fractions) < 2 {
		t.Errorf("console timestamps never changed their milliseconds: %v", fractions)
	}
}

// TestLogColour: on a terminal console lines are coloured, unless NO_COLOR is set.
func TestLogColour(t *testing.T) {
	tty := openPTY(t)
	for _, noColor := range []string{"", "1"} {
		t.Setenv("NO_COLOR", noColor)
		log := newLogger(conf.Log{Level: "info", Format: "auto"}, tty.slave)
		log.Info().Msg("hello")
		line := tty.readLine(t)
		if coloured := strings.Contains(line, "\x1b["); coloured != (noColor == "") {
			t.Errorf("NO_COLOR=%q: line %q coloured %v", noColor, line, coloured)
		}
	}
}

type pty struct {
	master, slave *os.File
	r             *bufio.Reader
}

func (p *pty) readLine(t *testing.T) string {
	t.Helper()
	p.master.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := p.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read the terminal: %v", err)
	}
	return line
}

// openPTY opens a pseudo-terminal pair, so that a test can write to a terminal.
func openPTY(t *testing.T) *pty {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return &pty{master: master, slave: slave, r: bufio.NewReader(master)}
}

// TestDemo runs `fulcrum demo` and checks the spread it prints.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() { // exits when ctx is cancelled
		done <- demo(ctx, []string{"-listen", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	var out strings.Builder
	sc := bufio.NewScanner(pr)
	var addr string
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if m := regexp.MustCompile(`try:\s+nc (\S+) (\d+)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = net.JoinHostPort(m[1], m[2])
			break
		}
	}
	for _, want := range []string{"order: alpha alpha alpha bravo alpha bravo charlie alpha bravo charlie",
		"alpha    weight 5   10 connections", "bravo    weight 3    6 connections", "charlie  weight 2    4 connections"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if addr == "" {
		t.Fatalf("demo printed no address:\n%s", out.String())
	}
	// The balancer keeps serving: greet, then echo.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, _ := r.ReadString('\n')
	fmt.Fprintf(c, "hello\n")
	echoed, _ := r.ReadString('\n')
	c.Close()
	if !strings.Contains("alpha bravo charlie", strings.TrimSpace(name)) || echoed != "hello\n" {
		t.Errorf("after the burst: greeting %q, echo %q", name, echoed)
	}
	cancel()
	go io.Copy(io.Discard, pr) // let the demo finish printing
	if code := <-done; code != 0 {
		t.Errorf("demo exited %d", code)
	}
}

// TestUsageNamesEveryCommand holds the usage text to the command table:
// each command run dispatches has a usage line, and each usage line's
// command is dispatched.
func TestUsageNamesEveryCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-h"}, &out, &errOut); code != 0 {
		t.Fatalf("run -h = %d; stderr %q", code, errOut.String())
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(?:usage:)?\s+fulcrum ([a-z]+)`).FindAllStringSubmatch(out.String(), -1) {
		listed[m[1]] = true
	}
	for name := range commands {
		if !listed[name] {
			t.Errorf("command %q is dispatched but not in the usage:\n%s", name, out.String())
		}
		delete(listed, name)
	}
	if len(listed) > 0 {
		t.Errorf("the usage names %v, which run does not dispatch", listed)
	}
}
