package health

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
	"fulcrum/sched"
)

// TestSentinelEventChecksAtOnce: with an interval of an hour, a Sentinel's
// +try-failover still checks the master at once, and the check (the
// Sentinel now reports failover_in_progress for it) puts it in the wrong
// role; Stop ends the subscription with the checks.
func TestSentinelEventChecksAtOnce(t *testing.T) {
	node := testkit.NewServer(t, func(c *net.TCPConn) {
		r := bufio.NewReader(c)
		for range 2 { // INFO replication, QUIT
			if _, err := testkit.ReadRESP(r); err != nil {
				return
			}
		}
		c.Write([]byte("$13\r\nrole:master\r\n\r\n+OK\r\n"))
	}).Addr
	failing := make(chan struct{}) // closed: the failover has begun
	var failed atomic.Bool
	sentinel := testkit.NewServer(t, func(c *net.TCPConn) {
		r := bufio.NewReader(c)
		v, err := testkit.ReadRESP(r)
		args, _ := v.([]any)
		if err != nil || len(args) < 2 {
			return
		}
		if args[0] == "SUBSCRIBE" {
			if _, err := testkit.ReadRESP(r); err != nil { // PSUBSCRIBE
				return
			}
			for i, ch := range append(args[1:], "-failover-abort-*") {
				kind := "subscribe"
				if i == len(args)-1 {
					kind = "psubscribe"
				}
				fmt.Fprintf(c, "*3\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n:%d\r\n", len(kind), kind, len(ch.(string)), ch, i+1)
			}
			select {
			case <-failing:
			case <-t.Context().Done(): // the test failed first
				return
			}
			h, p, _ := net.SplitHostPort(node)
			c.Write(testkit.RESP("message", "+try-failover", "master mymaster "+h+" "+p))
			r.ReadByte() // until the watcher closes
			return
		}
		if _, err := testkit.ReadRESP(r); err != nil { // SENTINEL MASTER
			return
		}
		h, p, _ := net.SplitHostPort(node)
		flags := "master"
		if failed.Load() {
			flags += ",failover_in_progress"
		}
		c.Write(testkit.RESP(h, p))
		c.Write(testkit.RESP("name", "mymaster", "ip", h, "port", p, "flags", flags))
	}).Addr

	pool := backend.Pool{}
	var tbl atomic.Pointer[sched.Table]
	hc := New(zerolog.Nop(), tbl.Load, func() {})
	pool.Changes = hc.Changes()
	b := pool.Get("s", "m")
	tbl.Store(table(0, b))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { hc.Run(ctx); close(done) }() // exits at cancel
	defer func() { cancel(); <-done }()
	defer hc.Stop()

	probe := Probe{Kind: CheckRedis, Addr: node, Backend: node, Timeout: 2 * time.Second, Role: backend.RolePrimary,
		Sentinels: []string{sentinel}, MasterName: "mymaster"}
	hc.SetChecks([]Job{{B: b, Spec: CheckSpec{Probe: probe, Interval: time.Hour, Rise: 1, Fall: 1}}})
	await := func(what string, ok func(st backend.State, reason string) bool) {
		t.Helper()
		testkit.WaitFor(t, 15*time.Second, func() error {
			st, _ := b.State()
			if _, reason, _ := b.Health(); !ok(st, reason) {
				return fmt.Errorf("%s: state %v, %q", what, st, reason)
			}
			return nil
		})
	}
	// The first check comes at the subscription, not an hour later.
	await("checked at the subscription", func(st backend.State, reason string) bool { return b.Checks().OK == 1 && st == backend.StateUp })
	failed.Store(true)
	close(failing)
	await("wrong role at +try-failover", func(st backend.State, reason string) bool {
		return st == backend.StateWrongRole && strings.Contains(reason, "is failing over")
	})
}
