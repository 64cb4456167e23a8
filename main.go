// Command fulcrum is a Layer-4 TCP load balancer: it accepts connections,
// picks a backend with an LVS-style scheduler and splices bytes both ways.
//
//	fulcrum [-config /etc/fulcrum/fulcrum.toml]   run
//	fulcrum -check [-config PATH]                  validate, print a summary, exit 0 or 1
//	fulcrum -version
//	fulcrum status [-config PATH | -admin ADDR]     the running daemon's backends and counters
//	fulcrum drain [-undo] [-config PATH | -admin ADDR]  take the instance out of rotation (or back)
//	fulcrum healthz [-config PATH | -admin ADDR]    exit 0 if /healthz says 200 (for exec probes)
//	fulcrum demo                                    three echo backends behind a balancer
//
// main.go holds flags and wiring only.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/admin"
	"fulcrum/cluster"
	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/sched"
	"fulcrum/systemd"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return status(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "drain" {
		return drain(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "healthz" {
		return healthz(args[1:], stdout, stderr)
	}
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
		fmt.Fprintf(stderr, "usage: fulcrum [-config FILE] [-check] [-version]\n       fulcrum status [-config FILE | -admin ADDR] [-json]\n"+
			"       fulcrum drain [-undo] [-config FILE | -admin ADDR]\n       fulcrum healthz [-config FILE | -admin ADDR]\n"+
			"       fulcrum demo [-listen ADDR]\n\n")
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
		cfg.WriteSummary(stdout)
		return 0
	}
	// SIGUSR1 and SIGUSR2 would kill the process by default: catch them first.
	usr := make(chan os.Signal, 2)
	signal.Notify(usr, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(usr)
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signalContext()
	defer stop()
	var ptr atomic.Pointer[sched.Table]
	inst := cluster.New(ptr.Load, log)
	ictx, stopInst := context.WithCancel(ctx)
	instDone := make(chan struct{})
	go func() { inst.Run(ictx, usr); close(instDone) }() // exits at the first SIGTERM, or when run returns
	defer func() { stopInst(); <-instDone }()
	srv := listener.New(&ptr, log)
	m := reload.New(*path, &ptr, srv, log)
	m.OnLog = setLevel
	hup, stopHup := hupChannel()
	defer stopHup()
	m.Hup = hup
	var sd systemd.Notifier
	m.Notify = func(state string) error { _, err := sd.Notify(state); return err }
	m.Watchdog = sd.WatchdogInterval()
	socks, err := sd.Listeners()
	if err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	for _, so := range socks {
		a := srv.Inherit(so.Listener)
		log.Info().Stringer("addr", a).Str("name", so.Name).Msg("socket passed by systemd")
		if so.Name != "" {
			if m.Sockets == nil {
				m.Sockets = map[string][]netip.AddrPort{}
			}
			m.Sockets[so.Name] = append(m.Sockets[so.Name], a)
		}
	}
	log.Info().Str("version", versionString()).Str("config", *path).Msg("starting")
	if os.Geteuid() == 0 {
		log.Warn().Msg("running as root: fulcrum needs no privilege but binding ports below 1024; run it as an unprivileged user with CAP_NET_BIND_SERVICE, as systemd/fulcrum.service does, or let systemd pass the sockets")
	}
	if why := conf.Exposed(*path); why != "" {
		log.Warn().Msg(why)
	}
	if a := cfg.Admin.Listen; a.IsValid() {
		ln, err := net.Listen("tcp", a.String())
		if err != nil {
			log.Error().Err(err).Msg("cannot start the admin listener")
			return 1
		}
		log.Info().Stringer("addr", ln.Addr()).Msg("admin listening: /metrics /status /healthz /drain")
		src := admin.Source{Table: ptr.Load, Reloads: m.Status, Sockets: srv.Sockets, Instance: inst, Version: versionString(), Hosts: cfg.Admin.Hosts}
		actx, stopAdmin := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- admin.Serve(actx, ln, admin.Handler(src), admin.Options{Log: log}) }() // exits when stopAdmin is called
		defer func() {                                                                             // after the drain, so that it can be watched
			stopAdmin()
			if err := <-done; err != nil {
				log.Warn().Err(err).Msg("admin listener")
			}
		}()
	}
	if err := m.Run(ctx, cfg); err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// adminClient bounds every request to the admin listener.
var adminClient = http.Client{Timeout: 5 * time.Second}

// signalContext ends on the first SIGINT, SIGTERM or SIGQUIT, which starts a
// graceful shutdown; a second one exits at once. SIGQUIT is nginx's graceful
// stop, and operators used to it send it; Go's default for it (dump every
// goroutine, exit 2) would drop every connection.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGQUIT)
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

// hupChannel delivers SIGHUP as a reload request.
func hupChannel() (<-chan struct{}, func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGHUP)
	hup := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { // exits when stop is called
		for {
			select {
			case <-sig:
				select {
				case hup <- struct{}{}:
				default: // one pending request is enough
				}
			case <-done:
				return
			}
		}
	}()
	return hup, func() {
		signal.Stop(sig)
		close(done)
	}
}

// setLevel applies the reloadable part of [log]: the level. The root
// logger is at trace level; the global level filters.
func setLevel(lc conf.Log) {
	level, err := zerolog.ParseLevel(lc.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	zerolog.SetGlobalLevel(level)
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
	setLevel(lc)
	return zerolog.New(w).With().Timestamp().Logger()
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
