// Package proxy starts a whole fulcrum proxy inside a test, from the text
// of a configuration, the way the daemon does: conf.Load, a
// listener.Server, and a reload.Manager running on the file. Tests of a
// listener feature (PROXY protocol, allow and deny, per-source limits,
// accept rates…) use it to configure the feature as a user would and
// then talk to it over loopback. It is a subpackage of testkit because
// listener's own tests import testkit, which therefore must not import
// listener or reload.
//
// Typical use, from an external test package (package listener_test):
//
//	be := testkit.NewServer(t, testkit.Greeter("a"))
//	p := proxy.Start(t, fmt.Sprintf(`
//	[services.s]
//	listen = ["127.0.0.1:0"]
//	backends = [{ name = "a", address = %q }]
//	`, be.Addr))
//	c, _ := net.Dial("tcp", p.Addr(t, "127.0.0.1:0"))
//
// The test's cleanup stops the Manager, which closes the listeners and
// drains the sessions, and waits for it. Reload rewrites the file and waits
// for the Manager to apply it, as an operator's edit would.
package proxy

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
	"fulcrum/listener"
	"fulcrum/reload"
)

// Proxy is a running proxy: its listeners, its snapshot and its log.
type Proxy struct {
	Logs *testkit.LogSink // every line it logs, as JSON

	path   string
	srv    *listener.Server
	m      *reload.Manager
	ready  chan struct{} // one send per finished reload attempt (READY=1)
	cancel context.CancelFunc
	done   chan error
}

// Start writes text to fulcrum.toml in a temporary directory, loads it
// and runs a reload.Manager on it until the test's cleanup. It returns
// once the first configuration is applied. A configuration without a
// drain_timeout is given none of its own: the 5m default would hold a
// failed test's cleanup, so write one where sessions may stay open.
func Start(t testing.TB, text string) *Proxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fulcrum.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := conf.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Logs: testkit.NewLogSink(), path: path, ready: make(chan struct{}, 1), done: make(chan error, 1)}
	log := zerolog.New(p.Logs)
	p.srv = listener.New(log)
	m := reload.New(path, p.srv, log, reload.Options{Notify: func(s string) error {
		if strings.HasPrefix(s, "READY=1") { // for Reload
			select {
			case p.ready <- struct{}{}:
			default:
			}
		}
		return nil
	}})
	p.m = m
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.done <- m.Run(ctx, cfg) }() // exits when the test's cleanup cancels ctx
	t.Cleanup(func() {
		cancel()
		if err := <-p.done; err != nil {
			t.Errorf("reload.Manager.Run: %v", err)
		}
	})
	select {
	case <-m.Ready():
	case err := <-p.done:
		p.done <- err // for the cleanup
		t.Fatalf("reload.Manager.Run ended before the first configuration was applied: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the first configuration was not applied within 10s: %s", m.Status().LastError)
	}
	return p
}

// Addr returns the address the listener configured as listen (as in the
// file, such as "127.0.0.1:0") is bound to.
func (p *Proxy) Addr(t testing.TB, listen string) string {
	t.Helper()
	a := p.srv.Addr(netip.MustParseAddrPort(listen))
	if a == nil {
		t.Fatalf("no listener for %s", listen)
	}
	return a.String()
}

// Admission returns the admission counters of service (zero when the
// proxy serves no such service).
func (p *Proxy) Admission(service string) listener.AdmissionStats {
	st, _ := p.srv.Admission(service)
	return st
}

// Snapshot returns the table and policies the proxy serves now.
func (p *Proxy) Snapshot() *listener.Snapshot { return p.srv.Snapshot() }

// Manager is the reload.Manager following the file (its Events, Status).
func (p *Proxy) Manager() *reload.Manager { return p.m }

// Server is the listener.Server serving the snapshot.
func (p *Proxy) Server() *listener.Server { return p.srv }

// Reload renames text over the proxy's file, as an editor saves it, and
// returns once the Manager has applied it as the next generation; it fails
// the test if the Manager refuses it or applies nothing within 10 s.
func (p *Proxy) Reload(t testing.TB, text string) {
	t.Helper()
	select { // an attempt that finished before this edit is not its answer
	case <-p.ready:
	default:
	}
	gen := p.Snapshot().Gen
	tmp := p.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p.path); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for p.Snapshot().Gen == gen {
		select {
		case <-p.ready:
			if p.Snapshot().Gen == gen {
				if last := p.m.Status().LastError; last != "" {
					t.Fatalf("the reload was refused: %s", last)
				}
			}
		case <-timeout:
			t.Fatalf("the edit was not applied within 10s (generation %d; last error %q)", gen, p.m.Status().LastError)
		}
	}
}
