package admin

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/cluster"
	"fulcrum/sched"
	"fulcrum/status"
)

// TestHealthzUnderTrickle: 100 clients that send their request headers a
// byte a second (any local user can) hold every place of the admin
// listener, yet the keepalived check of docs/scale-out.md (curl --max-time
// 1, every second, fall 2) never fails: each probe takes the place of the
// connection that has waited longest for its request. Before, the probe
// waited in the kernel's queue for a trickler's 5 s header timeout, and
// 20 of 27 checks failed (issue 30).
func TestHealthzUnderTrickle(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 12 s")
	}
	src := Source{}
	addr := serve(t, Handler(src), Options{Log: zerolog.Nop()}) // the daemon's defaults: 64 places, 5 s for headers
	const tricklers = 100
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex // protects open
	open := map[net.Conn]bool{}
	defer func() {
		close(stop)
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for range tricklers {
		wg.Add(1)
		go func() { // trickles until stop, reconnecting when closed
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				mu.Lock()
				open[c] = true
				mu.Unlock()
				_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
				for err == nil {
					select {
					case <-stop:
						err = net.ErrClosed
						continue
					case <-time.After(time.Second):
					}
					_, err = io.WriteString(c, "X")
				}
				mu.Lock()
				delete(open, c)
				mu.Unlock()
				c.Close()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second) // every place taken (as in the field report's script)

	// The check, as keepalived runs it: one request a second, 1 s for all of it.
	probe := func() (time.Duration, error) {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return time.Since(start), err
		}
		defer c.Close()
		c.SetDeadline(start.Add(time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
			return time.Since(start), err
		}
		b, err := io.ReadAll(c)
		if err == nil && !strings.HasPrefix(string(b), "HTTP/1.1 200") {
			err = io.ErrUnexpectedEOF
		}
		return time.Since(start), err
	}
	const checks = 10
	failed, tripped, prev, worst := 0, 0, false, time.Duration(0)
	for i := range checks {
		tick := time.Now()
		d, err := probe()
		worst = max(worst, d)
		if err != nil {
			failed++
			if prev {
				tripped++
			}
			t.Logf("check %d failed after %v: %v", i+1, d.Round(time.Millisecond), err)
		}
		prev = err != nil
		time.Sleep(time.Until(tick.Add(time.Second)))
	}
	t.Logf("%d checks, %d failed, the slowest %v", checks, failed, worst.Round(time.Millisecond))
	if failed > 0 {
		t.Errorf("%d of %d checks failed while %d clients trickled headers (fall 2 tripped %d times); want none", failed, checks, tricklers, tripped)
	}
}

// TestHealthzAnswersInstance: the probe that takes a trickler's place gets
// the instance's real answer (here 503: nothing up), not a default.
func TestHealthzAnswersInstance(t *testing.T) {
	inst := cluster.New(func() *sched.Table { return nil }, zerolog.Nop())
	addr := serve(t, Handler(Source{Source: status.Source{Instance: inst}}), Options{MaxConns: 2})
	for range 2 { // silent: each waits for a request
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
	b, err := io.ReadAll(c)
	if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 503") {
		t.Errorf("probe beside 2 silent connections at a cap of 2: %q, %v; want the instance's 503", b, err)
	}
}
