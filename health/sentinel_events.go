package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// sentinelWakes are the Sentinel events (pub/sub channels) that wake the
// checks of MasterName's nodes at once, in the order a failover publishes
// them (sentinel.c): +try-failover as it starts (SENTINEL FAILOVER, or a
// master seen objectively down), when failover_in_progress is already set
// and the old master's writes are about to be erased; the promotion
// (+failover-state-send-slaveof-noone) comes one or two timer ticks (about
// 0.1–0.2 s) later. The later ones (+promoted-slave, reconf-slaves,
// +switch-master, +config-update-from on the other Sentinels) name the new
// master, and -failover-abort-* (a PSUBSCRIBE pattern) ends the failover
// with the old master kept.
var sentinelWakes = []string{
	"+try-failover", "+elected-leader", "+failover-state-select-slave", "+selected-slave",
	"+failover-state-send-slaveof-noone", "+failover-state-wait-promotion", "+promoted-slave",
	"+failover-state-reconf-slaves", "+failover-end", "+failover-end-for-timeout", "+switch-master",
	"+config-update-from",
}

const sentinelAbort = "-failover-abort-*"

// Sentinel subscriptions' timing: a PING every sentinelPing, a connection
// silent for sentinelSilence is dead, and a lost one is dialled again after
// a back-off that doubles from sentinelRetryMin to sentinelRetryMax.
var (
	sentinelPing     = 5 * time.Second
	sentinelSilence  = 15 * time.Second
	sentinelRetryMin = 100 * time.Millisecond
	sentinelRetryMax = 5 * time.Second
)

// WatchSentinel holds a subscription to the failover events of MasterName
// on the Sentinel at addr until ctx ends, and calls wake with each event
// about it (channel and payload), and with "subscribed" each time a
// subscription is in place (events may have been missed while it was
// not). The checks then look at once instead of at their next interval:
// the old master is out (failover_in_progress, see sentinelAgrees) before
// the replica is promoted, and the promoted one in as soon as a Sentinel
// names it. A lost connection is reported to lost and dialled again with
// back-off. The events only wake the checks; the checks decide.
//
// It returns when ctx ends, having closed its connection and ended its
// pinger.
func (p *Probe) WatchSentinel(ctx context.Context, addr string, wake func(event, payload string), lost func(error)) {
	backoff := sentinelRetryMin
	for {
		began := time.Now()
		err := p.sentinelSubscription(ctx, addr, wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > sentinelRetryMax {
			backoff = sentinelRetryMin // it was up for a while: this is a new loss
		}
		lost(err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, sentinelRetryMax)
	}
}

// sentinelSubscription runs one subscription until it fails or ctx ends.
func (p *Probe) sentinelSubscription(ctx context.Context, addr string, wake func(event, payload string)) error {
	dctx, cancel := context.WithTimeout(ctx, max(p.Timeout, time.Second))
	c, err := p.netDialer().DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // ctx's end unblocks the read at once
	cmds := resp(nil, append([]string{"SUBSCRIBE"}, sentinelWakes...)...)
	cmds = resp(cmds, "PSUBSCRIBE", sentinelAbort)
	c.SetWriteDeadline(time.Now().Add(max(p.Timeout, time.Second)))
	if _, err := c.Write(cmds); err != nil {
		return err
	}
	c.SetWriteDeadline(time.Time{})
	r := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(sentinelSilence))
	for range len(sentinelWakes) + 1 {
		m, err := redisArray(r, 16)
		if err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		if len(m) < 1 || (m[0] != "subscribe" && m[0] != "psubscribe") {
			return fmt.Errorf("subscribe: unexpected answer %q", m)
		}
	}
	wake("subscribed", addr)

	var wg sync.WaitGroup
	done := make(chan struct{})
	defer wg.Wait()
	defer func() { // before the Wait: ends the pinger, even one stuck in a write to a full socket
		close(done)
		c.Close()
	}()
	wg.Go(func() { // exits at done, or at the first failed write
		t := time.NewTicker(sentinelPing)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			c.SetWriteDeadline(time.Now().Add(sentinelSilence))
			if _, err := c.Write(resp(nil, "PING")); err != nil {
				c.Close() // the reader sees it
				return
			}
		}
	})
	for {
		c.SetReadDeadline(time.Now().Add(sentinelSilence))
		m, err := redisArray(r, 16)
		if err != nil {
			if errors.Is(err, net.ErrClosed) && ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		var event, payload string
		switch {
		case len(m) == 3 && m[0] == "message":
			event, payload = m[1], m[2]
		case len(m) == 4 && m[0] == "pmessage":
			event, payload = m[2], m[3]
		default:
			continue // pong
		}
		if sentinelAbout(p.MasterName, event, payload) {
			wake(event, payload)
		}
	}
}

// sentinelAbout reports whether an event's payload is about the master
// called name: "master <name> <ip> <port> …" for the master's own events,
// "<kind> <instance> <ip> <port> @ <name> <ip> <port>" for its replicas'
// and Sentinels', "<name> <old ip> <old port> <new ip> <new port>" for
// +switch-master.
func sentinelAbout(name, event, payload string) bool {
	f := strings.Fields(payload)
	if event == "+switch-master" {
		return len(f) > 0 && f[0] == name
	}
	if len(f) >= 2 && f[0] == "master" {
		return f[1] == name
	}
	for i, x := range f {
		if x == "@" {
			return i+1 < len(f) && f[i+1] == name
		}
	}
	return false
}
