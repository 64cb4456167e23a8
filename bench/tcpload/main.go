// Command tcpload is the load generator and echo backend of fulcrum's
// benchmark harness (bench/run.sh). It talks to loopback addresses only,
// every loop in it is bounded in count and in time, and each client mode
// prints one JSON line on stdout for the script to parse.
//
//	tcpload -mode echo -listen 127.0.0.1:21001[,ADDR…]
//	    an echo backend on each address until SIGINT or SIGTERM (or -life)
//	tcpload -mode connrate -addr ADDR[,ADDR…] -c 32 -size 64 -d 5s -warmup 1s
//	    each of c clients loops: connect, send size bytes, read the echo, close
//	tcpload -mode pingpong -addr ADDR[,ADDR…] -c 32 -size 64 -d 5s -warmup 1s
//	tcpload -mode openloop -addr ADDR[,ADDR…] -c 32 -rate 20000 -size 64 -d 5s -warmup 1s
//	    c persistent connections, each sends size bytes and waits for the echo
//	tcpload -mode idle -addr ADDR -c 9000 [-hold 10m] [-ready FILE]
//	    open c connections and ping each once; write the number held to FILE;
//	    hold them until SIGUSR1, SIGINT or SIGTERM (or -hold); ping each again
//	    and report how many are still alive
//
// With several addresses, connections go round robin over them: that is the
// "direct" target, the echo backends without a proxy in front.
//
// A failed connection or ping is counted in the JSON (by kind, such as
// "dial: refused" or "read: timeout") and the run goes on: running out of
// descriptors in the proxy under test is a result, not a crash. Exit status:
// 0 when the run finished (whatever it counted), 1 when it could not run,
// 2 for bad flags, 3 when the watchdog ended a run that overran its bounds.
//
// Every mode raises RLIMIT_NOFILE to its hard limit first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Bounds on what the flags may ask for.
const (
	maxConns = 100_000          // -c; far above any descriptor limit we know
	maxSize  = 1 << 20          // -size
	maxOps   = 1 << 26          // operations per worker in one run
	maxDur   = 30 * time.Minute // -d, -warmup, -hold, -open-budget
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tcpload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", "", "echo, connrate, pingpong, openloop or idle")
	listen := fs.String("listen", "", "echo: comma-separated loopback `addresses` to serve")
	life := fs.Duration("life", 4*time.Hour, "echo: exit after this long even if never signalled")
	addrs := fs.String("addr", "", "client modes: comma-separated loopback `addresses`, used round robin")
	var cfg config
	fs.IntVar(&cfg.conns, "c", 32, "clients (connrate), connections (pingpong, idle)")
	fs.IntVar(&cfg.size, "size", 64, "message size in bytes")
	fs.Float64Var(&cfg.rate, "rate", 1000, "openloop: messages per second offered, over all connections")
	fs.DurationVar(&cfg.dur, "d", 5*time.Second, "measured duration (connrate, pingpong)")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured run before -d (connrate, pingpong)")
	fs.DurationVar(&cfg.timeout, "timeout", 2*time.Second, "bound on each connect and each ping")
	fs.DurationVar(&cfg.hold, "hold", 10*time.Minute, "idle: longest hold when no signal comes")
	fs.DurationVar(&cfg.openBudget, "open-budget", 2*time.Minute, "idle: time allowed for opening; connections not tried by then count as skipped")
	fs.IntVar(&cfg.par, "par", 128, "idle: connections opened or pinged at once")
	fs.StringVar(&cfg.ready, "ready", "", "idle: `file` to write the number of held connections to once all are open")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tcpload: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	nofile, err := raiseNoFile()
	if err != nil {
		fmt.Fprintf(stderr, "tcpload: raise RLIMIT_NOFILE: %v\n", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *mode == "echo" {
		lst, err := loopbackList(*listen)
		if err != nil {
			return bad("-listen: %v", err)
		}
		ctx, cancel := context.WithTimeout(ctx, *life)
		defer cancel()
		if err := serveEcho(ctx, lst, nil); err != nil {
			fmt.Fprintf(stderr, "tcpload: %v\n", err)
			return 1
		}
		return 0
	}

	if cfg.addrs, err = loopbackList(*addrs); err != nil {
		return bad("-addr: %v", err)
	}
	if err := cfg.check(); err != nil {
		return bad("%v", err)
	}
	var res any
	switch *mode {
	case "connrate":
		defer watchdog(cfg.warmup + cfg.dur + 2*cfg.timeout + 30*time.Second)()
		r := connRate(&cfg)
		r.NoFile = nofile
		res = r
	case "pingpong":
		defer watchdog(cfg.warmup + cfg.dur + 4*cfg.timeout + 30*time.Second)()
		r := pingPong(&cfg)
		r.NoFile = nofile
		res = r
	case "openloop":
		if cfg.rate < 1 || cfg.rate > 1e7 {
			return bad("-rate %v: want 1 to 10,000,000", cfg.rate)
		}
		defer watchdog(cfg.warmup + cfg.dur + 4*cfg.timeout + 30*time.Second)()
		r := openLoop(&cfg)
		r.NoFile = nofile
		res = r
	case "idle":
		defer watchdog(cfg.openBudget + cfg.hold + 4*cfg.timeout + time.Minute)()
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		r, err := idle(ctx, &cfg, usr1)
		if err != nil {
			fmt.Fprintf(stderr, "tcpload: %v\n", err)
			return 1
		}
		r.NoFile = nofile
		res = r
	default:
		return bad("-mode must be echo, connrate, pingpong, openloop or idle; got %q", *mode)
	}
	line, err := json.Marshal(res)
	if err != nil {
		panic(err) // plain structs of numbers and strings always marshal
	}
	fmt.Fprintf(stdout, "%s\n", line)
	return 0
}

// config is what the client modes run with; check validates it.
type config struct {
	addrs      []string
	conns      int
	size       int
	rate       float64 // openloop
	dur        time.Duration
	warmup     time.Duration
	timeout    time.Duration
	hold       time.Duration
	openBudget time.Duration
	par        int
	ready      string
}

func (c *config) check() error {
	var errs []error
	if c.conns < 1 || c.conns > maxConns {
		errs = append(errs, fmt.Errorf("-c %d: want 1 to %d", c.conns, maxConns))
	}
	if c.size < 1 || c.size > maxSize {
		errs = append(errs, fmt.Errorf("-size %d: want 1 to %d", c.size, maxSize))
	}
	if c.par < 1 || c.par > 4096 {
		errs = append(errs, fmt.Errorf("-par %d: want 1 to 4096", c.par))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		min  time.Duration
	}{{"-d", c.dur, time.Millisecond}, {"-warmup", c.warmup, 0}, {"-timeout", c.timeout, time.Millisecond},
		{"-hold", c.hold, 0}, {"-open-budget", c.openBudget, time.Millisecond}} {
		if d.v < d.min || d.v > maxDur {
			errs = append(errs, fmt.Errorf("%s %v: want %v to %v", d.name, d.v, d.min, maxDur))
		}
	}
	return errors.Join(errs...)
}

// loopbackList parses comma-separated IP:port addresses and refuses any
// that is not on the loopback network: this tool never sends load elsewhere.
func loopbackList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("no address given")
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		ap, err := netip.ParseAddrPort(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if !ap.Addr().IsLoopback() {
			return nil, fmt.Errorf("%s is not a loopback address", ap)
		}
		out = append(out, ap.String())
	}
	return out, nil
}

// raiseNoFile sets the soft RLIMIT_NOFILE to the hard limit and returns it:
// the idle mode holds thousands of sockets, the echo backend as many.
func raiseNoFile() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	return l.Cur, nil
}

// watchdog ends the process if a run overruns every bound it was given:
// a stuck kernel queue must not turn into a stuck benchmark. The returned
// func disarms it.
func watchdog(d time.Duration) (stop func() bool) {
	return time.AfterFunc(d, func() {
		fmt.Fprintf(os.Stderr, "tcpload: watchdog: still running after %v\n", d)
		os.Exit(3)
	}).Stop
}
