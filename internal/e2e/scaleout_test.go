package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"fulcrum/conf"
	"fulcrum/internal/testkit"
)

// nameThenClose greets with name and closes first, so that the client's
// side holds no TIME_WAIT socket after thousands of connections.
func nameThenClose(name string) func(*net.TCPConn) {
	return func(c *net.TCPConn) { c.Write([]byte(name + "\n")) }
}

// loopbackClients returns n distinct addresses spread over 127.0.0.0/8:
// i times an odd constant is a bijection of the 24 host bits, so the
// addresses differ in every octet, as real clients do. Last octets 0 and
// 255 are skipped.
func loopbackClients(n int) []netip.Addr {
	out := make([]netip.Addr, 0, n)
	for i := uint32(1); len(out) < n; i++ {
		v := i * 2654435761 & 0xffffff
		if b := byte(v); b == 0 || b == 255 {
			continue
		}
		out = append(out, netip.AddrFrom4([4]byte{127, byte(v >> 16), byte(v >> 8), byte(v)}))
	}
	return out
}

// greetFrom connects to lb from the local address from (port chosen by the
// kernel), reads the backend's greeting and resets the connection (SO_LINGER
// 0), so that 10,000 connections leave no TIME_WAIT behind on this side.
func greetFrom(from netip.Addr, lb string) (string, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", lb)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.(*net.TCPConn).SetLinger(0)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("greeting from %s: %w", from, err)
	}
	return strings.TrimSpace(line), nil
}

// choices asks every balancer in lbs for the backend of each client, with
// a bounded number of workers, and returns choice[lb][client].
func choices(t *testing.T, clients []netip.Addr, lbs ...string) [][]string {
	t.Helper()
	out := make([][]string, len(lbs))
	for i := range out {
		out[i] = make([]string, len(clients))
	}
	const workers = 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() { // exits after its share of clients, or at its first error
			defer wg.Done()
			for i := w; i < len(clients); i += workers {
				for k, lb := range lbs {
					name, err := greetFrom(clients[i], lb)
					if err != nil {
						errs <- err
						return
					}
					out[k][i] = name
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// TestMaglevAgreement runs two fulcrum daemons with the same configuration
// and mh, and checks that 10,000 clients, each from its own loopback
// address, reach the same backend through either one: what lets ECMP or a
// VRRP failover move a client to another instance without moving it to
// another backend. A third daemon whose file lacks one backend disagrees on
// that backend's clients: the comparison can tell, and it measures what a
// configuration rolled out to one instance before the other costs.
func TestMaglevAgreement(t *testing.T) {
	names := []string{"pg-a", "pg-b", "pg-c", "pg-d", "pg-e"}
	addrs := map[string]string{}
	for _, n := range names {
		addrs[n] = testkit.NewServer(t, nameThenClose(n)).Addr
	}
	config := func(order []string) string {
		var b strings.Builder
		b.WriteString("[log]\nformat = \"json\"\naccess = false\n[services.pg]\nlisten = [\"127.0.0.1:0\"]\nscheduler = \"mh\"\n")
		for _, n := range order {
			fmt.Fprintf(&b, "[[services.pg.backends]]\nname = %q\naddress = %q\n", n, addrs[n])
		}
		return b.String()
	}
	same := config(names)
	a, b := startDaemon(t, same), startDaemon(t, same)
	lbA, lbB := a.listenAddr(t), b.listenAddr(t)

	clients := loopbackClients(10000)
	start := time.Now()
	got := choices(t, clients, lbA, lbB)
	took := time.Since(start)
	share := map[string]int{}
	differ := 0
	for i, c := range clients {
		share[got[0][i]]++
		if got[0][i] != got[1][i] {
			if differ++; differ <= 5 {
				t.Errorf("client %s: instance A chose %s, instance B %s", c, got[0][i], got[1][i])
			}
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d clients differ between two instances with the same configuration", differ, len(clients))
	}
	// Agreement would be trivial if every client went to one backend.
	for _, n := range names {
		if f := float64(share[n]) / float64(len(clients)); f < 0.15 || f > 0.25 {
			t.Errorf("backend %s got %.1f%% of the clients; want about 20%%", n, 100*f)
		}
	}
	t.Logf("%d clients, %d connections in %v: %d differ; shares %v", len(clients), 2*len(clients), took.Round(time.Millisecond), differ, share)

	// An instance one change behind (pg-e not yet added) must disagree on
	// pg-e's clients, and on few others: Maglev moves little beyond them.
	c := startDaemon(t, config(names[:4]))
	lbC := c.listenAddr(t)
	sample := clients[:2000]
	stale := choices(t, sample, lbC)[0]
	ofE, others := 0, 0
	for i := range sample {
		switch {
		case got[0][i] == "pg-e":
			ofE++
			if stale[i] == "pg-e" {
				t.Fatalf("client %s reached pg-e through an instance without it", sample[i])
			}
		case stale[i] != got[0][i]:
			others++
		}
	}
	if ofE == 0 || others > len(sample)/20 {
		t.Errorf("stale instance: %d clients of pg-e moved, %d others; want some and at most 5%%", ofE, others)
	}
	t.Logf("an instance without pg-e: its %d clients (of %d) moved, and %d others", ofE, len(sample), others)
}

// healthService is the part of consul-template's HealthService (a passing
// instance of a service in Consul's catalog) that the template reads.
type healthService struct {
	Node, ID, Address string
	Port              int
}

// renderConsul renders docs/consul-template/fulcrum.toml.ctmpl as
// consul-template would: Go's text/template with consul-template's
// `service` (passing instances, sorted by node, then ID) and `env` over
// the given catalog and environment.
func renderConsul(t *testing.T, catalog map[string][]healthService, env map[string]string) []byte {
	t.Helper()
	funcs := template.FuncMap{
		"service": func(name string) []healthService {
			list := slices.Clone(catalog[name])
			slices.SortStableFunc(list, func(a, b healthService) int {
				return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
			})
			return list
		},
		"env": func(k string) string { return env[k] },
	}
	tmpl, err := template.New("fulcrum.toml.ctmpl").Funcs(funcs).ParseFiles("../../docs/consul-template/fulcrum.toml.ctmpl")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestConsulTemplate renders the repository's consul-template template for
// a catalog that changes, renames each rendering over a running fulcrum's
// file as consul-template does, and sees fulcrum follow: a new instance is
// added and takes its share of clients; an empty catalog is refused while
// the last good file keeps serving.
func TestConsulTemplate(t *testing.T) {
	a := testkit.NewServer(t, nameThenClose("node-a"))
	b := testkit.NewServer(t, nameThenClose("node-b"))
	inst := func(node, addr string) healthService {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		return healthService{Node: node, ID: "pg-" + node, Address: host, Port: p}
	}
	env := map[string]string{"FULCRUM_ADMIN": "127.0.0.1:0", "FULCRUM_PG_LISTEN": "127.0.0.1:0"}
	path := filepath.Join(t.TempDir(), "fulcrum.toml")
	first := renderConsul(t, map[string][]healthService{"pg": {inst("node-a", a.Addr)}}, env)
	if err := os.WriteFile(path, first, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := conf.Parse(path, first); err != nil {
		t.Fatalf("the rendered template is not a valid configuration: %v\n%s", err, first)
	}
	d := startDaemonArgs(t, []string{"-config", path}, nil, nil)
	lb := d.listenAddr(t)
	clients := loopbackClients(200)
	for _, c := range clients[:10] {
		if got, err := greetFrom(c, lb); err != nil || got != "node-a" {
			t.Fatalf("with node-a alone, %s reached %q, %v", c, got, err)
		}
	}

	// node-b passes its checks: listed first (sorted by node) in one
	// rendering, last in another, the file is the same.
	both := renderConsul(t, map[string][]healthService{"pg": {inst("node-b", b.Addr), inst("node-a", a.Addr)}}, env)
	if again := renderConsul(t, map[string][]healthService{"pg": {inst("node-a", a.Addr), inst("node-b", b.Addr)}}, env); !bytes.Equal(both, again) {
		t.Errorf("the rendering depends on the catalog's order:\n%s\n%s", both, again)
	}
	replaceFile(t, path, both)
	if added := fmt.Sprint(d.await(t, "reload applied")["added"]); added != "[pg/node-b]" {
		t.Errorf("reload added %s; want [pg/node-b]", added)
	}
	share := map[string]int{}
	for _, c := range clients {
		got, err := greetFrom(c, lb)
		if err != nil {
			t.Fatal(err)
		}
		share[got]++
	}
	if share["node-a"] < 50 || share["node-b"] < 50 {
		t.Errorf("after node-b joined, 200 clients spread %v; want both well used", share)
	}

	// Every instance fails its checks: the rendering has no backends and
	// is refused; the running configuration keeps serving.
	replaceFile(t, path, renderConsul(t, map[string][]healthService{}, env))
	if errs := fmt.Sprint(d.awaitPrefix(t, "reload refused")["errors"]); !strings.Contains(errs, "services.pg.backends: a service needs at least one backend") {
		t.Errorf("refusal: %s", errs)
	}
	if got, err := greetFrom(clients[0], lb); err != nil || got == "" {
		t.Errorf("after the empty rendering was refused: %q, %v; want a backend", got, err)
	}
}

// TestKubernetesManifest checks that the fulcrum.toml inside the ConfigMap
// of docs/kubernetes/fulcrum.yaml is a valid configuration (conf does not
// resolve host names, so the cluster's names are parsed as they are).
func TestKubernetesManifest(t *testing.T) {
	data, err := os.ReadFile("../../docs/kubernetes/fulcrum.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The block scalar under "fulcrum.toml: |", dedented.
	var toml []string
	indent := ""
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.TrimSpace(line) == "fulcrum.toml: |":
			in = true
		case in && indent == "" && strings.TrimSpace(line) != "":
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
			fallthrough
		case in && (strings.HasPrefix(line, indent) || strings.TrimSpace(line) == ""):
			toml = append(toml, strings.TrimPrefix(line, indent))
		case in:
			in = false
		}
	}
	if len(toml) == 0 {
		t.Fatal("no fulcrum.toml block in the ConfigMap")
	}
	text := strings.Join(toml, "\n")
	if _, err := conf.Parse("fulcrum.yaml", []byte(text)); err != nil {
		t.Errorf("the ConfigMap's fulcrum.toml is invalid: %v\n%s", err, text)
	}
}
