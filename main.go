// Command fulcrum is a Layer-4 TCP load balancer: it accepts connections,
// picks a backend with an LVS-style scheduler and splices bytes both ways.
//
//	fulcrum [-config /etc/fulcrum/fulcrum.toml]   run
//	fulcrum -check [-config PATH]                  validate, print a summary, exit 0 or 1
//	fulcrum -version
//	fulcrum demo                                    three echo backends behind a balancer
//
// main.go holds flags and wiring only.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/sched"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		ctx, stop := signalContext()
		defer stop()
		return demo(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("fulcrum", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", conf.DefaultPath, "configuration `file`")
	check := fs.Bool("check", false, "validate the configuration, print a summary and exit (0 valid, 1 not)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: fulcrum [-config FILE] [-check] [-version]\n       fulcrum demo [-listen ADDR]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fulcrum: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "fulcrum", versionString())
		return 0
	}
	cfg, err := conf.Load(*path)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum: configuration is invalid:\n%v\n", err)
		return 1
	}
	if *check {
		summary(stdout, cfg)
		return 0
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signalContext()
	defer stop()
	var ptr atomic.Pointer[sched.Table]
	srv := listener.New(&ptr, log)
	m := reload.New(*path, &ptr, srv, log)
	log.Info().Str("version", versionString()).Str("config", *path).Msg("starting")
	if err := m.Serve(ctx, cfg); err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// signalContext ends on the first SIGINT or SIGTERM, which starts a graceful
// shutdown; a second one exits at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { // exits when stop is called
		select {
		case <-ch:
			cancel()
		case <-done:
			return
		}
		select {
		case <-ch:
			fmt.Fprintln(os.Stderr, "fulcrum: second signal, exiting now")
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

// newLogger builds the root logger from the [log] table.
func newLogger(lc conf.Log, w io.Writer) zerolog.Logger {
	console := lc.Format == "console"
	if lc.Format == "auto" {
		if f, ok := w.(*os.File); ok {
			_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
			console = err == nil
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	level, err := zerolog.ParseLevel(lc.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", ""
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			return "dev-" + rev + dirty
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}

// summary prints what -check validated, on one screen.
func summary(w io.Writer, cfg *conf.Config) {
	fmt.Fprintf(w, "%s: configuration is valid\n", cfg.File)
	fmt.Fprintf(w, "log: level %s, format %s, access log %v\n", cfg.Log.Level, cfg.Log.Format, onOff(cfg.Log.Access))
	if len(cfg.Services) == 0 {
		fmt.Fprintln(w, "no services")
	}
	for _, s := range cfg.Services {
		listen := make([]string, len(s.Listen))
		for i, a := range s.Listen {
			listen[i] = a.String()
		}
		params := ""
		switch s.Scheduler { // only the parameters this scheduler reads
		case "p2c":
			params = fmt.Sprintf(" (choices %d)", s.Choices)
		case "sh":
			params = fmt.Sprintf(" (hash_key %s)", s.HashKey)
		case "mh":
			params = fmt.Sprintf(" (hash_key %s, table_size %d)", s.HashKey, s.TableSize)
		}
		fmt.Fprintf(w, "\nservice %s  scheduler %s%s  listen %s\n", s.Name, s.Scheduler, params, strings.Join(listen, " "))
		fmt.Fprintf(w, "  connect_timeout %s  idle_timeout %s  retries %d  drain_timeout %s\n",
			s.ConnectTimeout, durOrNone(s.IdleTimeout), s.Retries, durOrNone(s.DrainTimeout))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  backend\taddress\tweight\t")
		for _, b := range s.Backends {
			addr := b.Addr.String()
			if addr != b.Address {
				addr = b.Address + " (" + addr + ")"
			}
			weight := fmt.Sprint(b.Weight)
			if b.Weight == 0 {
				weight += " (drain)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", b.Name, addr, weight)
		}
		tw.Flush()
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func durOrNone(d interface{ String() string }) string {
	if s := d.String(); s != "0s" {
		return s
	}
	return "none"
}
