package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// rateResult is the JSON line of connrate and pingpong. Ops, the rate and
// the percentiles count only operations that completed inside the measured
// window; OpsTotal and Errors cover the warm-up too, so that a proxy's CPU
// time over the whole run can be divided by OpsTotal.
type rateResult struct {
	Mode     string            `json:"mode"`
	Conns    int               `json:"conns"`                   // clients or connections asked for
	Open     int               `json:"open,omitempty"`          // pingpong: connections that opened
	Size     int               `json:"size"`                    // message size in bytes
	Seconds  float64           `json:"seconds"`                 // the measured window
	Ops      uint64            `json:"ops"`                     // in the window
	OpsTotal uint64            `json:"ops_total"`               // including warm-up
	Rate     float64           `json:"ops_per_s"`               // Ops / Seconds
	P50      float64           `json:"p50_us"`                  // latency of one operation
	P99      float64           `json:"p99_us"`                  //
	P999     float64           `json:"p999_us"`                 //
	Offered  float64           `json:"offered_per_s,omitempty"` // openloop: the rate asked for
	Max      float64           `json:"max_us"`                  //
	Errors   uint64            `json:"errors"`                  // failed operations, warm-up included
	Kinds    map[string]uint64 `json:"error_kinds,omitempty"`   // Errors by kind
	NoFile   uint64            `json:"nofile"`                  // RLIMIT_NOFILE after raising it
}

// idleResult is the JSON line of the idle mode.
type idleResult struct {
	Mode    string            `json:"mode"`
	Asked   int               `json:"asked"`   // -c
	Held    int               `json:"held"`    // opened and answered the first ping
	Alive   int               `json:"alive"`   // of Held, answered the final ping too
	Skipped int               `json:"skipped"` // not tried: the open budget ran out
	OpenSec float64           `json:"open_s"`  // time to open and ping all
	HoldSec float64           `json:"hold_s"`  // time held before the final ping
	Errors  uint64            `json:"errors"`  // failed opens, first and final pings
	Kinds   map[string]uint64 `json:"error_kinds,omitempty"`
	NoFile  uint64            `json:"nofile"`
}

// tally is one worker's private count; merged once the worker is done.
type tally struct {
	h      hist
	ops    uint64
	total  uint64
	errors uint64
	kinds  map[string]uint64
	maxLat time.Duration
}

func (t *tally) fail(err error) {
	if t.kinds == nil {
		t.kinds = map[string]uint64{}
	}
	t.errors++
	t.kinds[kind(err)]++
}

// done counts one successful operation of latency d that ended at t1.
func (t *tally) done(t0, t1, warmEnd, end time.Time) {
	t.total++
	if t1.Before(warmEnd) || !t1.Before(end) {
		return
	}
	d := t1.Sub(t0)
	t.ops++
	t.h.add(d)
	t.maxLat = max(t.maxLat, d)
}

func (t *tally) merge(o *tally) {
	t.h.merge(&o.h)
	t.ops += o.ops
	t.total += o.total
	t.errors += o.errors
	t.maxLat = max(t.maxLat, o.maxLat)
	for k, v := range o.kinds {
		if t.kinds == nil {
			t.kinds = map[string]uint64{}
		}
		t.kinds[k] += v
	}
}

// loop runs op back to back until end, at most maxOps times, and counts
// each run. After a failure it returns if stopOnError, else it pauses for
// errorPause and goes on. op gets the run's number and start time.
func (t *tally) loop(warmEnd, end time.Time, stopOnError bool, op func(i int, t0 time.Time) error) {
	for i := 0; i < maxOps; i++ {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		if err := op(i, t0); err != nil {
			t.total++
			t.fail(err)
			if stopOnError {
				return
			}
			time.Sleep(errorPause)
			continue
		}
		t.done(t0, time.Now(), warmEnd, end)
	}
}

func mergeAll(ts []tally) *tally {
	var all tally
	for i := range ts {
		all.merge(&ts[i])
	}
	return &all
}

func (t *tally) result(mode string, cfg *config) *rateResult {
	return &rateResult{Mode: mode, Conns: cfg.conns, Size: cfg.size, Seconds: cfg.dur.Seconds(),
		Ops: t.ops, OpsTotal: t.total, Rate: float64(t.ops) / cfg.dur.Seconds(),
		P50: t.h.quantile(0.50), P99: t.h.quantile(0.99), P999: t.h.quantile(0.999), Max: float64(t.maxLat) / 1e3,
		Errors: t.errors, Kinds: t.kinds}
}

// opError says in which step of an operation err happened.
type opError struct {
	step string // dial, write, read, echo
	err  error
}

func (e *opError) Error() string { return e.step + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

var errMismatch = errors.New("echo differs from what was sent")

// kind names an error for the counts: its step and a short cause.
func kind(err error) string {
	step := "other"
	var oe *opError
	if errors.As(err, &oe) {
		step = oe.step
	}
	cause := "other"
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		cause = "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		cause = "eof"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		cause = "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		cause = "refused"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		cause = "out of descriptors"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		cause = "no local port"
	case errors.Is(err, errMismatch):
		cause = "mismatch"
	default:
		var errno syscall.Errno
		if errors.As(err, &errno) {
			cause = errno.Error()
		}
	}
	return step + ": " + cause
}

// dialer has no keepalive, so that the client spends no setsockopt calls
// per connection on something a benchmark of seconds never needs.
func dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAlive: -1}
}

// ping sends msg and reads the echo into buf (the same length).
func ping(c net.Conn, msg, buf []byte) error {
	if _, err := c.Write(msg); err != nil {
		return &opError{"write", err}
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		return &opError{"read", err}
	}
	if !bytes.Equal(msg, buf) {
		return &opError{"echo", errMismatch}
	}
	return nil
}

// message returns a size-byte message that differs between workers.
func message(size, worker int) []byte {
	m := make([]byte, size)
	for i := range m {
		m[i] = byte('a' + (worker+i)%26)
	}
	return m
}

// errorPause slows a worker whose operation failed, so that a refusing
// target costs the machine little while the run counts its failures.
const errorPause = 10 * time.Millisecond

// connRate runs cfg.conns clients, each looping connect, one ping, close,
// for warmup+dur.
func connRate(cfg *config) *rateResult {
	start := time.Now()
	warmEnd := start.Add(cfg.warmup)
	end := warmEnd.Add(cfg.dur)
	tallies := make([]tally, cfg.conns)
	var wg sync.WaitGroup
	for w := range cfg.conns {
		wg.Add(1)
		go func() { // exits at end, or after maxOps operations
			defer wg.Done()
			d := dialer(cfg.timeout)
			msg, buf := message(cfg.size, w), make([]byte, cfg.size)
			tallies[w].loop(warmEnd, end, false, func(i int, t0 time.Time) error {
				return oneShot(d, cfg.addrs[(w+i)%len(cfg.addrs)], msg, buf, t0.Add(cfg.timeout))
			})
		}()
	}
	wg.Wait()
	return mergeAll(tallies).result("connrate", cfg)
}

// oneShot connects, pings once and closes; the client closes first.
func oneShot(d *net.Dialer, addr string, msg, buf []byte, deadline time.Time) error {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return &opError{"dial", err}
	}
	defer c.Close()
	c.SetDeadline(deadline)
	return ping(c, msg, buf)
}

// dialAll opens cfg.conns connections over cfg.addrs in turn; a failed
// dial is tallied on its slot, which stays nil. open counts the others.
func dialAll(cfg *config) (conns []net.Conn, tallies []tally, open int) {
	conns = make([]net.Conn, cfg.conns)
	tallies = make([]tally, cfg.conns)
	d := dialer(cfg.timeout)
	for i := range conns {
		c, err := d.Dial("tcp", cfg.addrs[i%len(cfg.addrs)])
		if err != nil {
			tallies[i].fail(&opError{"dial", err})
			continue
		}
		conns[i] = c
		open++
	}
	return conns, tallies, open
}

// pingPong opens cfg.conns connections, then each pings back to back for
// warmup+dur. A connection that fails stops; the others go on.
func pingPong(cfg *config) *rateResult {
	conns, tallies, open := dialAll(cfg)
	start := time.Now()
	warmEnd := start.Add(cfg.warmup)
	end := warmEnd.Add(cfg.dur)
	var wg sync.WaitGroup
	for w, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() { // exits at end, on an error, or after maxOps operations
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(end.Add(cfg.timeout)) // one bound for the whole run, not a timer per op
			msg, buf := message(cfg.size, w), make([]byte, cfg.size)
			tallies[w].loop(warmEnd, end, true, func(int, time.Time) error { return ping(c, msg, buf) })
		}()
	}
	wg.Wait()
	r := mergeAll(tallies).result("pingpong", cfg)
	r.Open = open
	return r
}

// idle opens cfg.conns connections (cfg.par at a time, round robin over
// cfg.addrs) and pings each once; a connection that fails is counted and
// closed. Once all are tried it writes the number held to cfg.ready, waits
// for release, ctx's end or cfg.hold, pings every held connection again and
// closes them all.
func idle(ctx context.Context, cfg *config, release <-chan os.Signal) (*idleResult, error) {
	r := &idleResult{Mode: "idle", Asked: cfg.conns}
	conns := make([]net.Conn, cfg.conns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	d := dialer(cfg.timeout)
	msg := message(cfg.size, 0)
	start := time.Now()
	budget := start.Add(cfg.openBudget)
	skipped := make([]bool, cfg.conns)
	fails := forEach(cfg.conns, cfg.par, cfg.size, func(i int, buf []byte) error {
		if time.Now().After(budget) {
			skipped[i] = true
			return nil
		}
		c, err := d.Dial("tcp", cfg.addrs[i%len(cfg.addrs)])
		if err != nil {
			return &opError{"dial", err}
		}
		c.SetDeadline(time.Now().Add(cfg.timeout))
		if err := ping(c, msg, buf); err != nil {
			c.Close()
			return err
		}
		c.SetDeadline(time.Time{})
		conns[i] = c
		return nil
	})
	r.OpenSec = time.Since(start).Seconds()
	for i, c := range conns {
		if c != nil {
			r.Held++
		}
		if skipped[i] {
			r.Skipped++
		}
	}
	if cfg.ready != "" {
		if err := writeAtomic(cfg.ready, fmt.Sprintf("%d\n", r.Held)); err != nil {
			return nil, err
		}
	}

	held := time.Now()
	t := time.NewTimer(cfg.hold)
	select {
	case <-release:
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	r.HoldSec = time.Since(held).Seconds()

	alive := make([]bool, cfg.conns)
	final := forEach(cfg.conns, cfg.par, cfg.size, func(i int, buf []byte) error {
		c := conns[i]
		if c == nil {
			return nil
		}
		c.SetDeadline(time.Now().Add(cfg.timeout))
		if err := ping(c, msg, buf); err != nil {
			return &opError{"final ping", err}
		}
		alive[i] = true
		return nil
	})
	fails.merge(&final)
	for _, a := range alive {
		if a {
			r.Alive++
		}
	}
	r.Errors, r.Kinds = fails.errors, fails.kinds
	return r, nil
}

// forEach calls fn(i, buf) for every i in [0, n) on par goroutines, each
// with its own size-byte buf, and returns the failures it counted. Distinct
// calls get distinct i, so fn may write to index i of a slice unlocked.
func forEach(n, par, size int, fn func(i int, buf []byte) error) tally {
	var next atomic.Int64
	tallies := make([]tally, par)
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Add(1)
		go func() { // exits when every index has been taken
			defer wg.Done()
			buf := make([]byte, size)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i, buf); err != nil {
					tallies[w].fail(err)
				}
			}
		}()
	}
	wg.Wait()
	return *mergeAll(tallies)
}

// writeAtomic writes text to path through a temporary file and a rename, so
// that a reader polling for path never sees it half written.
func writeAtomic(path, text string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// openLoop sends on cfg.conns persistent connections at cfg.rate messages a
// second in all, on a fixed schedule whatever the answers do (wrk2's
// method): each message's latency runs from the time it was due to be sent,
// not from when it was, so that a stall delays the messages behind it and
// shows in the percentiles instead of lowering the rate offered. A
// connection's writer sends on time or, when behind, at once; its reader
// takes the echoes in order. A connection that fails stops; the others go on.
func openLoop(cfg *config) *rateResult {
	conns, tallies, open := dialAll(cfg)
	start := time.Now()
	warmEnd := start.Add(cfg.warmup)
	end := warmEnd.Add(cfg.dur)
	every := time.Duration(float64(cfg.conns) * float64(time.Second) / cfg.rate) // per connection
	var wg sync.WaitGroup
	for w, c := range conns {
		if c == nil {
			continue
		}
		// Due times are sent to the reader in order; the buffer bounds how
		// far the writer runs ahead of the answers (then it waits, and its
		// lateness is counted).
		due := make(chan time.Time, 4096)
		wg.Add(2)
		go func() { // writer: exits at end or on an error, closing due
			defer wg.Done()
			defer close(due)
			msg := message(cfg.size, w)
			first := start.Add(every * time.Duration(w) / time.Duration(cfg.conns)) // spread the connections
			for k := 0; k < maxOps; k++ {
				at := first.Add(every * time.Duration(k))
				if !at.Before(end) {
					return
				}
				if wait := time.Until(at); wait > 0 {
					time.Sleep(wait)
				}
				if _, err := c.Write(msg); err != nil {
					tallies[w].fail(&opError{"write", err})
					c.Close() // the reader stops too
					return
				}
				due <- at
			}
		}()
		go func() { // reader: exits when due is closed and drained, or on an error
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(end.Add(cfg.timeout)) // one bound for the whole run
			msg, buf := message(cfg.size, w), make([]byte, cfg.size)
			for at := range due {
				if _, err := io.ReadFull(c, buf); err != nil {
					tallies[w].fail(&opError{"read", err})
					for range due { // let the writer finish; its writes now fail
					}
					return
				}
				if !bytes.Equal(buf, msg) {
					tallies[w].fail(&opError{"echo", errors.New("echo differs from the message sent")})
					for range due {
					}
					return
				}
				if at.Before(warmEnd) { // due in the warm-up: counted in the total only
					tallies[w].total++
					continue
				}
				// In the window by its due time, however late its echo.
				tallies[w].done(at, time.Now(), at, end.Add(cfg.timeout))
			}
		}()
	}
	wg.Wait()
	r := mergeAll(tallies).result("openloop", cfg)
	r.Open = open
	r.Offered = cfg.rate
	return r
}
