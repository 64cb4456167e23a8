package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

func TestBucketPrecision(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 127, 128, 129, 1000, 4095, 65_537, 1e6, 123_456_789, 1 << 40, math.MaxUint64 >> 1} {
		mid := bucketMid(bucketOf(v))
		if v < 2*sub {
			if mid != float64(v) {
				t.Errorf("bucketMid(bucketOf(%d)) = %v; want exact", v, mid)
			}
			continue
		}
		if rel := math.Abs(mid-float64(v)) / float64(v); rel > 1.0/sub {
			t.Errorf("bucketMid(bucketOf(%d)) = %v; off by %.2f%%", v, mid, 100*rel)
		}
	}
	if got := bucketOf(math.MaxUint64); got != histBuckets-1 {
		t.Errorf("bucketOf(max) = %d; want %d", got, histBuckets-1)
	}
}

func TestQuantile(t *testing.T) {
	var h hist
	if got := h.quantile(0.5); got != 0 {
		t.Errorf("empty quantile = %v; want 0", got)
	}
	for v := 1; v <= 100_000; v++ { // 1 ns to 100 µs, uniform
		h.add(time.Duration(v))
	}
	var other hist
	other.merge(&h)
	for _, c := range []struct{ q, want float64 }{{0.5, 50}, {0.99, 99}, {1, 100}} {
		if got := other.quantile(c.q); math.Abs(got-c.want)/c.want > 0.02 {
			t.Errorf("quantile(%v) = %v µs; want %v ± 2%%", c.q, got, c.want)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"127.0.0.1:1", true},
		{"127.0.0.1:1, 127.0.0.2:2", true},
		{"[::1]:80", true},
		{"10.0.0.1:80", false},
		{"127.0.0.1:1,192.168.1.1:2", false},
		{"localhost:80", false},
		{"", false},
	} {
		_, err := loopbackList(c.in)
		if (err == nil) != c.ok {
			t.Errorf("loopbackList(%q) error = %v; want ok %v", c.in, err, c.ok)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-mode", "connrate", "-addr", "10.1.2.3:80"},
		{"-mode", "pingpong", "-addr", "127.0.0.1:1", "-c", "0"},
		{"-mode", "idle", "-addr", "127.0.0.1:1", "-d", "1h"},
		{"-mode", "bogus", "-addr", "127.0.0.1:1"},
		{"-mode", "echo"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("run(%q) = %d; want 2 (stderr %q)", args, code, errOut.String())
		}
		if out.Len() != 0 {
			t.Errorf("run(%q) wrote %q to stdout", args, out.String())
		}
	}
}

// startEcho serves echo on two loopback ports until the test ends.
func startEcho(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	bound := make(chan []string, 1)
	done := make(chan error, 1)
	go func() { done <- serveEcho(ctx, []string{"127.0.0.1:0", "127.0.0.1:0"}, bound) }() // exits on cancel
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveEcho: %v", err)
		}
	})
	select {
	case a := <-bound:
		return a
	case err := <-done:
		t.Fatalf("serveEcho: %v", err)
	}
	return nil
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func quick(addrs []string, conns int) *config {
	return &config{addrs: addrs, conns: conns, size: 64, dur: 200 * time.Millisecond, warmup: 50 * time.Millisecond,
		timeout: time.Second, hold: time.Minute, openBudget: 10 * time.Second, par: 8}
}

func TestConnRate(t *testing.T) {
	addrs := startEcho(t)
	r := connRate(quick(addrs, 4))
	if r.Ops == 0 || r.Errors != 0 || r.OpsTotal < r.Ops || r.P50 <= 0 || r.P99 < r.P50 || r.Max < r.P99*0.98 {
		t.Errorf("connrate against echo = %+v; want ops, no errors, ordered percentiles", r)
	}
	dead := connRate(quick([]string{deadAddr(t)}, 2))
	if dead.Ops != 0 || dead.Errors == 0 || dead.Kinds["dial: refused"] != dead.Errors {
		t.Errorf("connrate against a dead port = %+v; want only refused dials", dead)
	}
}

func TestPingPong(t *testing.T) {
	addrs := startEcho(t)
	r := pingPong(quick(addrs, 3))
	if r.Ops == 0 || r.Errors != 0 || r.Open != 3 || r.Rate <= 0 || r.P99 < r.P50 {
		t.Errorf("pingpong against echo = %+v", r)
	}
	cfg := quick([]string{addrs[0], deadAddr(t)}, 4) // every other connection is refused
	r = pingPong(cfg)
	if r.Open != 2 || r.Kinds["dial: refused"] != 2 || r.Ops == 0 {
		t.Errorf("pingpong half dead = %+v; want 2 open, 2 refused, ops", r)
	}
}

func TestOpenLoop(t *testing.T) {
	addrs := startEcho(t)
	cfg := quick(addrs, 4)
	cfg.rate = 2000
	r := openLoop(cfg)
	if r.Errors != 0 || r.Open != 4 || r.Offered != 2000 || r.P999 < r.P99 || r.P99 < r.P50 || r.P50 <= 0 {
		t.Errorf("openloop against echo = %+v", r)
	}
	// Every message due in the window is answered: the rate achieved is the
	// rate offered, give or take the messages at the window's edges.
	if r.Rate < 1000 || r.Rate > 3000 {
		t.Errorf("openloop rate = %v; want about the 2,000 offered", r.Rate)
	}
}

func TestIdle(t *testing.T) {
	addrs := startEcho(t)
	cfg := quick(addrs[:1], 200)
	cfg.ready = filepath.Join(t.TempDir(), "ready")
	release := make(chan os.Signal, 1)
	type out struct {
		r   *idleResult
		err error
	}
	res := make(chan out, 1)
	go func() { // exits after the release and the final ping
		r, err := idle(context.Background(), cfg, release)
		res <- out{r, err}
	}()
	var ready []byte
	testkit.WaitFor(t, 10*time.Second, func() error { // polling a file: no event to wait on
		var err error
		ready, err = os.ReadFile(cfg.ready)
		return err
	})
	if got := strings.TrimSpace(string(ready)); got != "200" {
		t.Errorf("ready file = %q; want 200", got)
	}
	release <- os.Interrupt
	o := <-res
	if o.err != nil || o.r.Held != 200 || o.r.Alive != 200 || o.r.Errors != 0 {
		t.Errorf("idle = %+v, %v; want 200 held and alive", o.r, o.err)
	}

	cfg = quick([]string{deadAddr(t)}, 20)
	cfg.hold = 0
	r, err := idle(context.Background(), cfg, nil)
	if err != nil || r.Held != 0 || r.Alive != 0 || r.Errors != 20 {
		t.Errorf("idle against a dead port = %+v, %v; want 20 errors, none held", r, err)
	}
}

// TestJSONLine runs a whole client mode as the script does and parses its line.
func TestJSONLine(t *testing.T) {
	addrs := startEcho(t)
	var out, errOut bytes.Buffer
	code := run([]string{"-mode", "pingpong", "-addr", strings.Join(addrs, ","), "-c", "2", "-d", "100ms", "-warmup", "0s"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("run = %d; stderr %q", code, errOut.String())
	}
	if strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("stdout = %q; want one line", out.String())
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("stdout is not JSON: %v", err)
	}
	for _, k := range []string{"ops_per_s", "p50_us", "p99_us", "ops_total", "errors", "nofile"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON line has no %q: %s", k, out.String())
		}
	}
}

func TestKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&opError{"dial", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, "dial: refused"},
		{&opError{"dial", &net.OpError{Op: "dial", Err: context.DeadlineExceeded}}, "dial: timeout"},
		{&opError{"read", os.ErrDeadlineExceeded}, "read: timeout"},
		{&opError{"read", io.ErrUnexpectedEOF}, "read: eof"},
		{&opError{"write", syscall.EPIPE}, "write: reset"},
		{&opError{"dial", syscall.ETIMEDOUT}, "dial: connection timed out"},
		{&opError{"echo", errMismatch}, "echo: mismatch"},
		{errors.New("odd"), "other: other"},
	} {
		if got := kind(c.err); got != c.want {
			t.Errorf("kind(%v) = %q; want %q", c.err, got, c.want)
		}
	}
}
