package e2e

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// greeterAt is a loopback backend that writes its name on each connection
// and holds it; kill closes it all, start brings it back on the same
// address.
type greeterAt struct {
	t    *testing.T
	name string
	addr string
	mu   sync.Mutex // protects ln and conns
	ln   net.Listener
	conn map[net.Conn]bool
	wg   sync.WaitGroup
}

func newGreeterAt(t *testing.T, name string) *greeterAt {
	g := &greeterAt{t: t, name: name, addr: "127.0.0.1:0", conn: map[net.Conn]bool{}}
	g.start()
	t.Cleanup(g.kill)
	return g
}

func (g *greeterAt) start() {
	g.t.Helper()
	var ln net.Listener
	if err := testkit.Until(10*time.Second, func() (err error) { // the old socket's port frees with no event
		ln, err = net.Listen("tcp", g.addr)
		return err
	}); err != nil {
		g.t.Fatalf("%s: listen on %s: %v", g.name, g.addr, err)
	}
	g.addr = ln.Addr().String()
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	g.wg.Add(1)
	go func() { // exits when kill closes ln
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			g.conn[c] = true
			g.mu.Unlock()
			g.wg.Add(1)
			go func() { // exits when the client or kill closes c
				defer g.wg.Done()
				fmt.Fprintf(c, "%s\n", g.name)
				c.Read(make([]byte, 1))
				g.mu.Lock()
				delete(g.conn, c)
				g.mu.Unlock()
				c.Close()
			}()
		}
	}()
}

func (g *greeterAt) kill() {
	g.mu.Lock()
	if g.ln != nil {
		g.ln.Close()
		g.ln = nil
	}
	for c := range g.conn {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// greetN greets n times through lb and fails unless want answers each.
func greetN(t *testing.T, lb, want string, n int, when string) {
	t.Helper()
	for range n {
		if got := greet(t, lb); got != want {
			t.Fatalf("%s: reached %s; want %s", when, got, want)
		}
	}
}

// TestFailbackManualDaemon drives the real binary: first over three
// backends with failback = "manual" and a state_file. The first is killed
// and new connections move to the second; brought back, it gets none,
// also after the daemon is stopped and started again on the same files;
// `fulcrum set db/a writer` moves them back.
func TestFailbackManualDaemon(t *testing.T) {
	a, b, c := newGreeterAt(t, "a"), newGreeterAt(t, "b"), newGreeterAt(t, "c")
	state := filepath.Join(t.TempDir(), "state.json")
	path := writeFile(t, "fulcrum.toml", fmt.Sprintf(`
[log]
format = "json"
[admin]
listen = "127.0.0.1:0"
state_file = %q
[services.db]
listen = ["127.0.0.1:0"]
scheduler = "first"
failback = "manual"
backends = [{ name = "a", address = %q }, { name = "b", address = %q }, { name = "c", address = %q }]
[services.db.health]
check = "tcp"
interval = "100ms"
timeout = "100ms"
rise = 2
fall = 2
`, state, a.addr, b.addr, c.addr))
	backendIs := func(msg, name string) func(map[string]any) bool {
		return func(m map[string]any) bool { return m["message"] == msg && m["backend"] == name }
	}
	d := startDaemonArgs(t, []string{"-config", path}, nil, nil)
	adm := d.adminAddr(t)
	lb := d.listenAddr(t)
	d.await(t, "configuration applied")
	greetN(t, lb, "a", 3, "at start")
	a.kill()
	d.awaitMatch(t, "a down", backendIs("backend down", "a"))
	greetN(t, lb, "b", 5, "a down")
	a.start()
	d.awaitMatch(t, "a up", backendIs("backend up", "a"))
	greetN(t, lb, "b", 10, "a back up, failback manual")

	d.cmd.Process.Signal(syscall.SIGTERM)
	d.expectExit(t, 20*time.Second)
	d = startDaemonArgs(t, []string{"-config", path}, nil, nil)
	adm = d.adminAddr(t)
	lb = d.listenAddr(t)
	d.await(t, "configuration applied")
	greetN(t, lb, "b", 10, "after the restart")

	var out, errOut strings.Builder
	if code := cli([]string{"set", "-admin", adm, "db/a", "writer"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "db/a now the writer") {
		t.Fatalf("fulcrum set db/a writer = %d: %q %q", code, out.String(), errOut.String())
	}
	greetN(t, lb, "a", 5, "after fulcrum set db/a writer")
	line := d.await(t, "writer moved")
	if line["writer"] != "a" || line["was"] != "b" || !strings.HasPrefix(fmt.Sprint(line["reason"]), "promoted by POST /backends/db/a/writer") {
		t.Errorf("writer moved line %v", line)
	}
	out.Reset()
	errOut.Reset()
	if code := cli([]string{"set", "-admin", adm, "db/nosuch", "writer"}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "no backend") {
		t.Errorf("fulcrum set db/nosuch writer = %d: %q; want an error naming it", code, errOut.String())
	}
}
