package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/listener/listenertest"
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
		addrs[n] = listenertest.NewServer(t, nameThenClose(n)).Addr
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
	lbA, lbB := a.await(t, "listening")["addr"].(string), b.await(t, "listening")["addr"].(string)

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
	lbC := c.await(t, "listening")["addr"].(string)
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
