package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/reload"
)

//go:embed demo.toml
var demoConfig string

var demoBackends = []string{"alpha", "bravo", "charlie"}

// demo runs fulcrum's main job on the embedded configuration: three echo
// backends that greet with their own name, a balancer in front of them
// (weights 5/3/2), a burst of connections, and then service until ctx ends.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fulcrum demo", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7000", "address of the balancer")
	burst := fs.Int("n", 20, "connections in the burst")
	if code, ok := parseFlags(fs, args, stdout, stderr, subUsage); !ok {
		return code
	}

	echo := &echoServers{}
	defer echo.stop()
	addrs, err := echo.start(demoBackends)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum demo: %v\n", err)
		return 1
	}
	var text bytes.Buffer
	template.Must(template.New("demo").Parse(demoConfig)).Execute(&text, map[string]any{"Listen": *listen, "Backends": addrs})
	cfg, err := conf.Parse("demo.toml (embedded)", text.Bytes())
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum demo: %v\n", err)
		return 1
	}

	log := newLogger(cfg.Log, stderr)
	srv := listener.New(log)
	m := reload.New("", srv, log, reload.Options{})
	if err := m.Apply(cfg); err != nil {
		fmt.Fprintf(stderr, "fulcrum demo: %v\n", err)
		if errors.Is(err, syscall.EADDRINUSE) {
			fmt.Fprintf(stderr, "fulcrum demo: pick another address, e.g. fulcrum demo -listen 127.0.0.1:0\n")
		}
		return 1
	}
	defer m.Shutdown(context.Background())
	lb := srv.Addr(cfg.Services[0].Listen[0]).String()

	fmt.Fprintf(stdout, "fulcrum demo: balancer on %s (scheduler %s)\n", lb, cfg.Services[0].Scheduler)
	for i, b := range cfg.Services[0].Backends {
		fmt.Fprintf(stdout, "  backend %-8s %s  weight %d\n", b.Name, addrs[i], b.Weight)
	}
	fmt.Fprintf(stdout, "\nsending %d connections, one after another...\n", *burst)
	counts, order, err := sendBurst(ctx, lb, *burst)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum demo: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\norder: %s\n\n", strings.Join(order, " "))
	for _, b := range cfg.Services[0].Backends {
		c := counts[b.Name]
		fmt.Fprintf(stdout, "  %-8s weight %d  %3d connections  %s\n", b.Name, b.Weight, c, strings.Repeat("#", c))
	}
	host, port, _ := net.SplitHostPort(lb)
	fmt.Fprintf(stdout, "\nfulcrum is serving on %s; try:  nc %s %s\n(without nc, in bash: exec 3<>/dev/tcp/%s/%s; head -1 <&3)\n"+
		"(each backend greets with its name, then echoes what you type)\nCtrl-C stops.\n", lb, host, port, host, port)
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping...")
	return 0
}

// sendBurst makes n sequential connections to addr and reads each greeting.
func sendBurst(ctx context.Context, addr string, n int) (map[string]int, []string, error) {
	counts := map[string]int{}
	var order []string
	d := net.Dialer{Timeout: 2 * time.Second}
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, err
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		name, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("read greeting: %w", err)
		}
		name = strings.TrimSpace(name)
		counts[name]++
		order = append(order, name)
	}
	return counts, order, nil
}

// echoServers are the demo's backends: each greets with its name and then
// echoes. stop closes them and every connection they hold, and waits.
type echoServers struct {
	wg    sync.WaitGroup
	mu    sync.Mutex // protects lns and conns
	lns   []net.Listener
	conns map[net.Conn]bool
}

func (e *echoServers) start(names []string) ([]string, error) {
	e.conns = map[net.Conn]bool{}
	var addrs []string
	for _, name := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.lns = append(e.lns, ln)
		e.mu.Unlock()
		addrs = append(addrs, ln.Addr().String())
		e.wg.Add(1)
		go e.serve(ln, name) // exits when stop closes ln
	}
	return addrs, nil
}

func (e *echoServers) serve(ln net.Listener, name string) {
	defer e.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.conns[c] = true
		e.mu.Unlock()
		e.wg.Add(1)
		go func() { // exits when the peer closes or stop closes c
			defer e.wg.Done()
			fmt.Fprintf(c, "%s\n", name)
			io.Copy(c, c)
			c.Close()
			e.mu.Lock()
			delete(e.conns, c)
			e.mu.Unlock()
		}()
	}
}

func (e *echoServers) stop() {
	e.mu.Lock()
	for _, ln := range e.lns {
		ln.Close()
	}
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}
