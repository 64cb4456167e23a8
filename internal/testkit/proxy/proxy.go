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
// drains the sessions, and waits for it.
package proxy

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
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

	srv    *listener.Server
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
	p := &Proxy{Logs: testkit.NewLogSink(), done: make(chan error, 1)}
	log := zerolog.New(p.Logs)
	p.srv = listener.New(log)
	m := reload.New(path, p.srv, log, reload.Options{})
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
