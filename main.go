// Command fulcrum is a Layer-4 TCP load balancer: it accepts connections,
// picks a backend with an LVS-style scheduler and splices bytes both ways.
//
//	fulcrum [-config /etc/fulcrum/fulcrum.toml]   run
//	fulcrum -check [-q] [-config PATH]             validate, print a summary (-q: nothing), exit 0 or 1
//	fulcrum version                                version, commit, Go version, build date (also -version)
//	fulcrum status [-config PATH | -admin ADDR]     the running daemon's backends and counters
//	fulcrum drain [-undo] [-config PATH | -admin ADDR]  take the instance out of rotation (or back)
//	fulcrum set [-config PATH | -admin ADDR] SERVICE/BACKEND drain|maint|ready|writer  hold one backend (or let it go, or make it the writer)
//	fulcrum healthz [-config PATH | -admin ADDR]    exit 0 if /healthz says 200 (for exec probes)
//	fulcrum upgrade [-config PATH | -admin ADDR]    hand over to the binary now installed, without dropping a connection
//	fulcrum demo                                    three echo backends behind a balancer
//
// The package is wiring: main.go holds the command table, the daemon's
// flags, its logger and signals, and serve, which builds the parts (the
// state file, the listener.Server, the cluster.Instance, the handover,
// the reload.Manager, the admin listener) and runs reload until a signal
// or an upgrade ends it; commands.go the commands that ask a running
// daemon over its admin listener; procs.go how many event loops; demo.go
// the demo. What each part does is its package's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"fulcrum/admin"
	"fulcrum/cluster"
	"fulcrum/conf"
	"fulcrum/handover"
	"fulcrum/listener"
	"fulcrum/logsink"
	"fulcrum/reload"
	"fulcrum/sched"
	"fulcrum/statefile"
	"fulcrum/systemd"
)

// Set at build time by the Makefile:
//
//	go build -ldflags "-X main.version=v0.2.0 -X main.commit=3a93fd5… -X main.date=2026-12-01T04:00:00Z"
//
// Empty values fall back to what the Go toolchain stamped (see buildInfo).
var version, commit, date = "", "", ""

// Log timestamps carry milliseconds, in RFC 3339, so that lines from the
// same second keep their order and match a database's own log. Set once,
// before any logger exists: zerolog reads it as a global.
func init() {
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// commands are fulcrum's subcommands, by their first argument; anything
// else is the daemon's own flags (run).
var commands = map[string]func(args []string, stdout, stderr io.Writer) int{
	"status":  status,
	"drain":   drain,
	"upgrade": upgrade,
	"healthz": healthz,
	"set":     set,
	"demo":    demoCommand,
	"version": versionCommand,
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if cmd := commands[args[0]]; cmd != nil {
			return cmd(args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("fulcrum", flag.ContinueOnError)
	path := fs.String("config", conf.DefaultPath, "configuration `file`")
	check := fs.Bool("check", false, "validate the configuration, print a summary and exit (0 valid, 1 not)")
	quiet := fs.Bool("q", false, "with -check: print nothing when the configuration is valid")
	showVersion := fs.Bool("version", false, "print version, commit, Go version and build date, and exit")
	if code, ok := parseFlags(fs, args, stdout, stderr, mainUsage); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fulcrum: unexpected argument %q\n", fs.Arg(0))
		fs.SetOutput(stderr)
		mainUsage(fs)
		return 2
	}
	if *showVersion {
		writeVersion(stdout)
		return 0
	}
	cfg, err := conf.Load(*path)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum: %v\n", configError(*path, err))
		return 1
	}
	// The event loops, one per P: set once (serve), before anything runs on
	// them. Setting it stops the runtime's own updates when the cgroup's
	// limit changes later, so such a change takes a restart
	// (docs/operations.md).
	loops, loopsFrom := chooseLoops(cfg.Process.Loops, os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0), readBudget())
	if !*check {
		return serve(*path, cfg, loops, loopsFrom, stderr)
	}
	// -q is for ExecStartPre= and ExecReload=: nothing on success, and no
	// DNS lookups to slow them (the daemon resolves and logs on its own).
	if !*quiet {
		cfg.WriteSummary(stdout)
		fmt.Fprintf(stdout, "\nprocess: %d event loop%s (%s)\n", loops, plural(loops), loopsFrom)
		if why := conf.Exposed(*path); why != "" {
			fmt.Fprintf(stderr, "fulcrum: warning: %s\n", why)
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stderr, "fulcrum: warning: %s\n", w)
		}
		for _, w := range reload.Warnings(context.Background(), cfg.Names()) {
			fmt.Fprintf(stderr, "fulcrum: warning: %s\n", w)
		}
	}
	return 0
}

func demoCommand(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signalContext(func() { fmt.Fprintln(stderr, "fulcrum demo: second signal, exiting now") })
	defer stop()
	return demo(ctx, args, stdout, stderr)
}

func versionCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "fulcrum version: unexpected argument %q\n", args[0])
		return 2
	}
	writeVersion(stdout)
	return 0
}

// serve runs the daemon on cfg, read from path, until a signal stops it or
// an upgrade hands over to a new process; it returns the exit code.
func serve(path string, cfg *conf.Config, loops int, loopsFrom string, stderr io.Writer) int {
	// SIGUSR1 and SIGUSR2 would kill the process by default: catch them first.
	usr := make(chan os.Signal, 2)
	signal.Notify(usr, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(usr)
	runtime.GOMAXPROCS(loops)
	log, sink := newDaemonLogger(cfg.Log, stderr)
	defer sink.Close(2 * time.Second)
	mlog := log.With().Str("component", "main").Logger() // main's own lines
	mlog.Info().Str("version", versionString()).Str("config", path).Int("procs", runtime.GOMAXPROCS(0)).
		Int("loops", loops).Str("loops_from", loopsFrom).Msg("starting")
	ctx, stop := signalContext(func() {
		mlog.Warn().Msg("second signal, exiting now")
		sink.Close(time.Second) // os.Exit follows: write out what is queued, this line included
	})
	defer stop()

	state, err := statefile.Open(cfg.Admin.StateFile, cfg.Admin.StateDamaged == conf.StateDamageStartEmpty, log)
	if err != nil {
		return 1 // Open logged why
	}
	srv := listener.New(log) // holds the published snapshot; reload publishes, the rest read
	inst := cluster.New(func() *sched.Table { return tableOf(srv) }, log)
	inst.OnChange = state.Changed
	if d := state.Restored().Instance; d != nil {
		mlog.Warn().Str("by", d.By).Time("since", d.Since).Msg("the instance was drained before the restart; it stays drained (fulcrum drain -undo)")
		inst.Drain(d.By)
	}
	var sd systemd.Notifier
	up, err := handover.New(srv, &sd, cfg.Admin.Listen, log.With().Str("component", "upgrade").Logger(), handover.Options{OnServe: state.StopWriting})
	if err != nil {
		mlog.Error().Err(err).Msg("cannot start")
		return 1
	}
	hup, stopHup := hupChannel()
	defer stopHup()
	m := reload.New(path, srv, log, reload.Options{Hup: hup, Notify: up.Notify, OnLog: setLevel, Watchdog: sd.WatchdogInterval(),
		State: state, Instance: inst.Drained, Sockets: up.Sockets()})
	ictx, stopInst := context.WithCancel(ctx)
	instDone := make(chan struct{})
	go func() { inst.Run(ictx, usr); close(instDone) }() // exits at the first SIGTERM, or when serve returns
	defer func() { stopInst(); <-instDone }()
	startWarnings(mlog, path, cfg)
	src := admin.Source{Build: buildInfo(), Hosts: cfg.Admin.Hosts, Set: m.SetOverride, Promote: m.Promote, Upgrade: up.Upgrade,
		Log:     func() (uint64, bool) { return sink.Dropped(), sink.Stalled() },
		History: &admin.History{}}
	src.Snapshot, src.Reloads, src.Sockets, src.Limit, src.Instance = srv.Snapshot, m.Status, srv.Sockets, srv.Limit, inst
	src.Version, src.Draining, src.Events, src.Watcher = versionString(), m.Draining, m.Events, m.Watcher()
	src.Admission = srv.Admission
	stopAdmin, waitAdmin, err := startAdmin(cfg.Admin, up, src, log, mlog)
	if err != nil {
		mlog.Error().Err(err).Msg("cannot start the admin listener")
		return 1
	}
	defer waitAdmin() // after the drain, so that it can be watched
	// Once an upgrade's new process serves, this one stops its admin
	// listener (the new one answers on the same socket) and drains, as on
	// SIGTERM but telling systemd nothing.
	rctx, stopServing := context.WithCancel(ctx)
	upDone := make(chan struct{})
	defer func() { stopServing(); <-upDone }()
	go func() { // exits at the hand-over or when serve returns
		defer close(upDone)
		select {
		case <-up.Done():
			stopAdmin()
			stopServing()
		case <-rctx.Done():
		}
	}()
	if err := m.Run(rctx, cfg); err != nil {
		mlog.Error().Err(err).Msg("cannot start")
		return 1
	}
	mlog.Info().Msg("stopped")
	return 0
}

// tableOf is the table srv serves; nil before the first.
func tableOf(srv *listener.Server) *sched.Table {
	if s := srv.Snapshot(); s != nil {
		return s.Table
	}
	return nil
}

// startWarnings logs what an operator should hear about at every start.
func startWarnings(mlog zerolog.Logger, path string, cfg *conf.Config) {
	if os.Geteuid() == 0 {
		mlog.Warn().Msg("running as root: fulcrum needs no privilege but binding ports below 1024; run it as an unprivileged user with CAP_NET_BIND_SERVICE, as systemd/fulcrum.service does, or let systemd pass the sockets")
	}
	if why := conf.Exposed(path); why != "" {
		mlog.Warn().Msg(why)
	}
	for _, w := range cfg.Warnings() {
		mlog.Warn().Msg(w)
	}
}

// startAdmin serves [admin] listen (the socket a previous process handed
// over, or a new one) and samples the console's plots until stop is
// called; wait calls stop and returns once both have ended. Without
// [admin] listen both do nothing.
func startAdmin(ac conf.Admin, up *handover.Upgrader, src admin.Source, log, mlog zerolog.Logger) (stop, wait func(), err error) {
	if !ac.Listen.IsValid() {
		return func() {}, func() {}, nil
	}
	ln, err := up.ListenAdmin()
	if err != nil {
		return nil, nil, err
	}
	mlog.Info().Stringer("addr", ln.Addr()).Msg("admin listening: /metrics /status /healthz /drain")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.Serve(ctx, ln, admin.Handler(src), admin.Options{Log: log}) }() // exits when stop is called
	sampled := make(chan struct{})
	go func() { // the console's plots; exits when stop is called
		defer close(sampled)
		src.History.Run(ctx, time.Second, src.Source)
	}()
	return cancel, func() {
		cancel()
		<-sampled
		if err := <-done; err != nil {
			mlog.Warn().Err(err).Msg("admin listener")
		}
	}, nil
}

// adminClient bounds every request to the admin listener.
var adminClient = http.Client{Timeout: 5 * time.Second}

// signalContext ends on the first SIGINT, SIGTERM or SIGQUIT, which starts a
// graceful shutdown; a second one calls second (to log it in the chosen
// format) and exits at once. SIGQUIT is nginx's graceful stop, and operators
// used to it send it; Go's default for it (dump every goroutine, exit 2)
// would drop every connection.
func signalContext(second func()) (context.Context, func()) {
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
			second()
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

// newDaemonLogger is the daemon's root logger: every line goes through a
// bounded buffer, since a log reader that stops reading must not stop the
// daemon (package logsink). The caller closes the sink.
func newDaemonLogger(lc conf.Log, stderr io.Writer) (zerolog.Logger, *logsink.Writer) {
	sink := logsink.New(stderr, logsink.DefaultSize)
	log := newLoggerOn(lc, stderr, sink)
	llog := log.With().Str("component", "log").Logger()
	sink.OnDrop = func(n uint64) {
		llog.Warn().Uint64("dropped", n).Uint64("dropped_total", sink.Dropped()).Msgf("log output was stalled: %d lines dropped", n)
	}
	return log, sink
}

// newLogger builds the root logger from the [log] table. Console lines
// are coloured only on a terminal, and never when NO_COLOR is set
// (https://no-color.org).
func newLogger(lc conf.Log, w io.Writer) zerolog.Logger {
	return newLoggerOn(lc, w, w)
}

// newLoggerOn is newLogger writing through w (the daemon's logsink) to
// term, the stream the lines end on, which decides the format.
func newLoggerOn(lc conf.Log, term, w io.Writer) zerolog.Logger {
	tty := isTerminal(term)
	if lc.Format == conf.LogConsole || lc.Format == conf.LogAuto && tty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "2006-01-02 15:04:05.000", NoColor: !tty || os.Getenv("NO_COLOR") != ""}
	}
	setLevel(lc)
	return zerolog.New(w).With().Timestamp().Logger()
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// parseFlags parses args into fs. -h, -help and --help print usage to
// stdout and end with 0; a bad flag prints the error and usage to stderr
// and ends with 2. ok is true when the caller should go on.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, usage func(*flag.FlagSet)) (code int, ok bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below, to the stream that fits
	err := fs.Parse(args)
	switch {
	case err == nil:
		fs.Usage = func() { usage(fs) }
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		usage(fs)
		return 0, false
	default:
		usage(fs)
		return 2, false
	}
}

func mainUsage(fs *flag.FlagSet) {
	fmt.Fprint(fs.Output(), `usage: fulcrum [-config FILE]                 run (default /etc/fulcrum/fulcrum.toml)
       fulcrum -check [-q] [-config FILE]    validate; -q prints nothing when valid
       fulcrum version                       version, commit, Go version, build date
       fulcrum status [-config FILE | -admin ADDR] [-json] [-v]
       fulcrum drain [-undo] [-config FILE | -admin ADDR]
       fulcrum set [-config FILE | -admin ADDR] SERVICE/BACKEND drain|maint|ready|writer
       fulcrum healthz [-config FILE | -admin ADDR]
       fulcrum upgrade [-config FILE | -admin ADDR]
       fulcrum demo [-listen ADDR] [-n N]

Signals: SIGHUP reloads, SIGTERM drains and stops, SIGUSR1/SIGUSR2 drain/undrain the instance.
See fulcrum(8) and fulcrum.toml(5).

`)
	fs.PrintDefaults()
}

// configError rewords a missing configuration file, which is a newcomer's
// first contact, not an invalid file.
func configError(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no configuration at %s; pass -config FILE, start from the example (/usr/share/doc/fulcrum/examples/fulcrum.toml from the package, systemd/fulcrum.toml in the source), or try `fulcrum demo`", path)
	}
	var ce *conf.Error
	if errors.As(err, &ce) {
		return fmt.Errorf("configuration is invalid:\n%w", err)
	}
	return err
}

// versionString is the version alone, as /status and the start line show it.
func versionString() string {
	return buildInfo()["version"]
}

// buildInfo describes this binary: version, commit, Go version and build
// date, from the Makefile's -ldflags or else from what the Go toolchain
// stamped (the commit's time stands in for a build date).
func buildInfo() map[string]string {
	bi := map[string]string{"version": version, "commit": commit, "date": date, "go": runtime.Version()}
	dirty := false
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if bi["commit"] == "" {
					bi["commit"] = s.Value
				}
			case "vcs.time":
				if bi["date"] == "" {
					bi["date"] = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if bi["version"] == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			bi["version"] = info.Main.Version
		}
	}
	if bi["version"] == "" {
		bi["version"] = "dev"
		if c := bi["commit"]; c != "" {
			bi["version"] = "dev-" + c[:min(len(c), 12)]
			if dirty {
				bi["version"] += "+dirty"
			}
		}
	}
	for k, v := range bi {
		if v == "" {
			bi[k] = "unknown"
		}
	}
	return bi
}

// writeVersion prints what `fulcrum version` shows, as haproxy -vv and
// nginx -V do: enough to say exactly which build is running.
func writeVersion(w io.Writer) {
	bi := buildInfo()
	fmt.Fprintf(w, "fulcrum %s\ncommit: %s\ngo: %s %s/%s\nbuilt: %s\n", bi["version"], bi["commit"], bi["go"], runtime.GOOS, runtime.GOARCH, bi["date"])
}
