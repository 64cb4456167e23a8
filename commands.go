package main

// The subcommands that ask a running daemon through its admin listener.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"fulcrum/admin"
	"fulcrum/backend"
	"fulcrum/conf"
	"fulcrum/handover"
)

// adminCommand parses the flags of a subcommand that asks the admin
// listener: -config and -admin, plus those more adds. It returns the admin
// address, or "" and the exit status to return.
func adminCommand(name string, args []string, stdout, stderr io.Writer, more func(*flag.FlagSet)) (addr string, code int) {
	addr, _, code = adminCommandArgs(name, "", 0, args, stdout, stderr, more)
	return addr, code
}

// adminCommandArgs is adminCommand for a command that takes n arguments
// after its flags (described by operands in its usage), returned in rest.
func adminCommandArgs(name, operands string, n int, args []string, stdout, stderr io.Writer, more func(*flag.FlagSet)) (addr string, rest []string, code int) {
	fs := flag.NewFlagSet("fulcrum "+name, flag.ContinueOnError)
	path := fs.String("config", conf.DefaultPath, "configuration `file` whose [admin] listen to ask")
	fs.StringVar(&addr, "admin", "", "admin `address` to ask (default: [admin] listen from the configuration)")
	if more != nil {
		more(fs)
	}
	usage := subUsage
	if operands != "" {
		usage = func(fs *flag.FlagSet) {
			fmt.Fprintf(fs.Output(), "usage: %s [flags] %s\n\n", fs.Name(), operands)
			fs.PrintDefaults()
		}
	}
	if code, ok := parseFlags(fs, args, stdout, stderr, usage); !ok {
		return "", nil, code
	}
	if fs.NArg() > n {
		fmt.Fprintf(stderr, "fulcrum %s: unexpected argument %q\n", name, fs.Arg(n))
		return "", nil, 2
	}
	if fs.NArg() < n {
		fmt.Fprintf(stderr, "fulcrum %s: want %s\n", name, operands)
		usage(fs)
		return "", nil, 2
	}
	rest = fs.Args()
	if addr != "" {
		return addr, rest, 0
	}
	var listen netip.AddrPort
	cfg, err := conf.Load(*path)
	var ce *conf.Error
	switch {
	case err == nil:
		listen = cfg.Admin.Listen
	case errors.As(err, &ce):
		// Someone is editing the file, and the daemon runs its last good
		// table: all this command needs is [admin] listen, read leniently.
		invalid := err
		if listen, err = conf.AdminListen(*path); err == nil && listen.IsValid() {
			warnInvalid(stderr, name, listen.String(), invalid)
		} else {
			err = configError(*path, invalid) // the file's own errors say it best
		}
	default:
		err = configError(*path, err)
	}
	if err == nil && !listen.IsValid() {
		err = fmt.Errorf("%s has no [admin] listen; set one, or pass -admin ADDR", *path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum %s: %v\n", name, err)
		return "", nil, 1
	}
	return listen.String(), rest, 0
}

// warnInvalid says, above a command's output, that the file on disk is
// invalid and that the running daemon at addr ignores it, naming the
// generation it runs when it answers.
func warnInvalid(w io.Writer, name, addr string, invalid error) {
	table := "the running table"
	c := adminClient
	c.Timeout = 2 * time.Second
	if _, st, err := fetchStatus(&c, addr); err == nil && st.Generation > 0 {
		table = fmt.Sprintf("the running table %d", st.Generation)
	}
	fmt.Fprintf(w, "fulcrum %s: the file on disk is invalid; %s ignores it:\n  %s\n", name, table,
		strings.ReplaceAll(invalid.Error(), "\n", "\n  "))
}

// unreachable adds what an operator should check when nothing answers at
// the admin address: the daemon may be down, or its [admin] listen may have
// changed in the file since it started (the table applies at start only).
func unreachable(err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w (is fulcrum running? [admin] listen applies only at start: after changing it, restart, or pass -admin with the running address)", err)
	}
	return err
}

// subUsage prints a subcommand's usage: its name and flags.
func subUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "usage: %s [flags]\n\n", fs.Name())
	fs.PrintDefaults()
}

// status prints the running daemon's /status as a table.
func status(args []string, stdout, stderr io.Writer) int {
	var raw, verbose, events *bool
	addr, code := adminCommand("status", args, stdout, stderr, func(fs *flag.FlagSet) {
		raw = fs.Bool("json", false, "print the JSON as served")
		verbose = fs.Bool("v", false, "also print each backend's whole reason and last check error")
		events = fs.Bool("events", false, "print the recent state changes (backends and services), oldest first, instead of the table")
	})
	if addr == "" {
		return code
	}
	js, st, err := fetchStatus(&adminClient, addr)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum status: %v\n", err)
		return 1
	}
	if *raw {
		stdout.Write(js)
		return 0
	}
	if *events {
		admin.WriteEvents(stdout, st.Events)
	} else if *verbose {
		admin.WriteTableVerbose(stdout, st)
	} else {
		admin.WriteTable(stdout, st)
	}
	return 0
}

// drain asks the running daemon to drain (POST /drain) or undrain, and
// prints its one-line answer.
func drain(args []string, stdout, stderr io.Writer) int {
	var undo *bool
	addr, code := adminCommand("drain", args, stdout, stderr, func(fs *flag.FlagSet) {
		undo = fs.Bool("undo", false, "undrain: put the instance back in rotation")
	})
	if addr == "" {
		return code
	}
	path := "/drain"
	if *undo {
		path = "/undrain"
	}
	body, status, err := post(&adminClient, addr, path)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum drain: %v\n", unreachable(err))
		return 1
	}
	if status != "" {
		fmt.Fprintf(stderr, "fulcrum drain: %s%s: %s: %s\n", addr, path, status, body)
		return 1
	}
	stdout.Write(body)
	return 0
}

// set asks the running daemon to hold one backend (drain, maint), to let
// it go (ready), or to make it the writer of its failback service
// (writer): POST /backends/SERVICE/BACKEND/STATE.
func set(args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "-list" || a == "--list" {
			return setList(args, stdout, stderr)
		}
	}
	addr, rest, code := adminCommandArgs("set", "SERVICE/BACKEND drain|maint|ready|writer", 2, args, stdout, stderr, func(fs *flag.FlagSet) {
		fs.Bool("list", false, "print the running daemon's SERVICE/BACKEND names, one a line, and exit (for shell completion)")
	})
	if addr == "" {
		return code
	}
	svc, name, ok := strings.Cut(rest[0], "/")
	if !ok || svc == "" || name == "" {
		fmt.Fprintf(stderr, "fulcrum set: %q is not SERVICE/BACKEND\n", rest[0])
		return 2
	}
	if _, ok := backend.ParseOverride(rest[1]); !ok && rest[1] != "writer" {
		fmt.Fprintf(stderr, "fulcrum set: %q is not one of drain, maint, ready, writer\n", rest[1])
		return 2
	}
	path := "/backends/" + url.PathEscape(svc) + "/" + url.PathEscape(name) + "/" + rest[1]
	body, status, err := post(&adminClient, addr, path)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum set: %v\n", unreachable(err))
		return 1
	}
	if status != "" {
		fmt.Fprintf(stderr, "fulcrum set: %s\n", body)
		return 1
	}
	stdout.Write(body)
	return 0
}

// setList prints the running daemon's SERVICE/BACKEND names, one a line,
// for shell completion.
func setList(args []string, stdout, stderr io.Writer) int {
	args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "-list" || a == "--list" })
	addr, code := adminCommand("set", args, stdout, stderr, func(fs *flag.FlagSet) {
		fs.Bool("list", false, "print the running daemon's SERVICE/BACKEND names, one a line, and exit (for shell completion)")
	})
	if addr == "" {
		return code
	}
	_, st, err := fetchStatus(&adminClient, addr)
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum set: %v\n", err)
		return 1
	}
	for _, s := range st.Services {
		for _, b := range s.Backends {
			if !b.Removed {
				fmt.Fprintf(stdout, "%s/%s\n", s.Name, b.Name)
			}
		}
	}
	return 0
}

// healthz prints the running daemon's /healthz line and exits 0 if it is
// 200: a health check for engines that run a command (Kubernetes exec
// probes, keepalived without curl) while the admin listener stays on
// loopback.
func healthz(args []string, stdout, stderr io.Writer) int {
	addr, code := adminCommand("healthz", args, stdout, stderr, nil)
	if addr == "" {
		return code
	}
	resp, err := adminClient.Get("http://" + addr + "/healthz")
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum healthz: %v\n", unreachable(err))
		return 1
	}
	defer resp.Body.Close()
	io.Copy(stdout, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

// upgrade asks the running daemon to hand its sockets to the binary now
// installed (POST /upgrade) and waits for the answer: 0 when the new
// process serves and the old one drains, 1 when the old one serves on.
func upgrade(args []string, stdout, stderr io.Writer) int {
	addr, code := adminCommand("upgrade", args, stdout, stderr, nil)
	if addr == "" {
		return code
	}
	c := adminClient
	c.Timeout = handover.Timeout + 10*time.Second // the daemon bounds the wait; this only backs it up
	body, status, err := post(&c, addr, "/upgrade")
	if err != nil {
		fmt.Fprintf(stderr, "fulcrum upgrade: %v\n", unreachable(err))
		return 1
	}
	if status != "" {
		fmt.Fprintf(stderr, "fulcrum upgrade: %s: %s: %s\n", addr, status, body)
		return 1
	}
	stdout.Write(body)
	return 0
}

// maxStatus bounds the /status a command reads: tens of thousands of
// backends fit.
const maxStatus = 64 << 20

// fetchStatus asks the admin listener at addr for /status with c: the JSON
// as served, and read into a Status. err says what went wrong in words
// fit for the command's error line: unreachable, an answer that is not 200
// OK (with its text), or one that is not a status.
func fetchStatus(c *http.Client, addr string) (js []byte, st admin.Status, err error) {
	resp, err := c.Get("http://" + addr + "/status")
	if err != nil {
		return nil, st, unreachable(err)
	}
	defer resp.Body.Close()
	js, err = io.ReadAll(io.LimitReader(resp.Body, maxStatus))
	if err != nil {
		return nil, st, fmt.Errorf("%s/status: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, st, fmt.Errorf("%s/status: %s: %s", addr, resp.Status, bytes.TrimSpace(js))
	}
	if err := json.Unmarshal(js, &st); err != nil {
		return nil, st, fmt.Errorf("%s/status: %w", addr, err)
	}
	return js, st, nil
}

// post sends an empty POST to path on the admin listener at addr. It
// returns the answer's body (at most 4 KiB), and status, the HTTP status,
// only when it is not 200 OK (the body then trimmed); err is a failure to
// reach the listener or to read its answer.
func post(c *http.Client, addr, path string) (body []byte, status string, err error) {
	resp, err := c.Post("http://"+addr+path, "text/plain", nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, "", err
	}
	if resp.StatusCode != http.StatusOK {
		return bytes.TrimSpace(body), resp.Status, nil
	}
	return body, "", nil
}
