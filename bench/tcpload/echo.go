package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// serveEcho echoes every connection on each address until ctx ends, then
// closes the listeners and every connection and waits for their goroutines.
// If bound is not nil it receives the bound addresses once all listen.
//
// A connection costs one goroutine and a 1 KiB buffer, which grows to
// 64 KiB only after a read fills it: ten thousand idle connections take
// tens of MiB, and the benchmark's small messages never grow a buffer.
func serveEcho(ctx context.Context, addrs []string, bound chan<- []string) error {
	lc := net.ListenConfig{KeepAlive: -1} // no keepalive setsockopt per accepted connection
	var lns []net.Listener
	for _, a := range addrs {
		ln, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("listen %s: %w", a, err)
		}
		lns = append(lns, ln)
	}
	if bound != nil {
		got := make([]string, len(lns))
		for i, ln := range lns {
			got[i] = ln.Addr().String()
		}
		bound <- got
	}
	var e echoer
	e.conns = map[net.Conn]struct{}{}
	for _, ln := range lns {
		e.wg.Add(1)
		go e.accept(ln) // exits when ln is closed below
	}
	<-ctx.Done()
	for _, ln := range lns {
		ln.Close()
	}
	e.mu.Lock()
	e.closed = true
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
	return nil
}

type echoer struct {
	wg     sync.WaitGroup // accept loops and connections
	mu     sync.Mutex     // protects conns and closed
	conns  map[net.Conn]struct{}
	closed bool // shutting down: close new connections at once
}

// accept runs one accept loop. Temporary errors (EMFILE when a test asks for
// more connections than descriptors) back off from 5 ms to 1 s, so that the
// loop neither ends nor spins; closing ln ends it.
func (e *echoer) accept(ln net.Listener) {
	defer e.wg.Done()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			continue
		}
		e.conns[c] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.echo(c.(*net.TCPConn)) // exits when the peer closes or shutdown closes c
	}
}

// echo writes back what it reads; on EOF it half-closes and ends.
func (e *echoer) echo(c *net.TCPConn) {
	defer e.wg.Done()
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, 1<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
			if n == len(buf) && len(buf) < 64<<10 {
				buf = make([]byte, 64<<10)
			}
		}
		if err != nil {
			c.CloseWrite()
			return
		}
	}
}
