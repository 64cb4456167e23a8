package backend

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
)

// sentinelAgrees asks every Sentinel in Sentinels which address is the
// master of MasterName (SENTINEL get-master-addr-by-name), at once, and
// decides by majority: more than half of the listed Sentinels must name
// the same address. A node that answers role:master is the primary only
// when that address is its own (Backend). One that is not named is in the
// wrong role: an old master that Sentinel has not yet reconfigured (after
// SENTINEL FAILOVER it is left a master until Sentinel's next INFO round,
// about 10 s), or a killed master restarted with its own configuration,
// acknowledges writes that its resync erases. Without a majority (too many
// Sentinels unreachable, or they disagree during a failover) no node is
// the primary: the error says what each one answered.
func (p *Probe) sentinelAgrees(ctx context.Context) error {
	answers := make([]string, len(p.Sentinels)) // the address named, or "error: …"
	var wg sync.WaitGroup
	for i, s := range p.Sentinels {
		wg.Go(func() { // exits when its exchange ends, at the latest at the probe's deadline
			addr, err := p.sentinelMaster(ctx, s)
			if err != nil {
				answers[i] = "error: " + err.Error()
				return
			}
			answers[i] = addr
		})
	}
	wg.Wait()
	votes := map[string]int{}
	for _, a := range answers {
		if !strings.HasPrefix(a, "error: ") && a != "" {
			votes[a]++
		}
	}
	need := len(p.Sentinels)/2 + 1
	for addr, n := range votes {
		if n < need {
			continue
		}
		if sameAddr(addr, p.Backend) {
			return nil
		}
		return &WrongRoleError{Observed: fmt.Sprintf("a master that the Sentinels do not name (%d of %d name %s)", n, len(p.Sentinels), addr), Want: p.wantName()}
	}
	var said []string
	for i, a := range answers {
		if a == "" {
			a = "no master known"
		}
		said = append(said, p.Sentinels[i]+": "+a)
	}
	sort.Strings(said)
	return fmt.Errorf("no majority of the %d Sentinels names a master for %q (%s)", len(p.Sentinels), p.MasterName, strings.Join(said, "; "))
}

// wantName is the role the probe wants, as WrongRoleError shows it.
func (p *Probe) wantName() string {
	if p.roleWanted() {
		return p.Role
	}
	return "a named master"
}

// sameAddr compares two host:port addresses, IPs by value (so that
// "::ffff:127.0.0.1" is 127.0.0.1).
func sameAddr(a, b string) bool {
	if a == b {
		return true
	}
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || ap != bp {
		return false
	}
	ai, bi := net.ParseIP(ah), net.ParseIP(bh)
	return ai != nil && bi != nil && ai.Equal(bi)
}

// sentinelMaster asks one Sentinel for MasterName's address: "" when it
// knows no such master (a null array), else host:port.
func (p *Probe) sentinelMaster(ctx context.Context, addr string) (string, error) {
	c, err := p.netDialer().DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // a cancelled probe unblocks at once
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(resp(nil, "SENTINEL", "get-master-addr-by-name", p.MasterName)); err != nil {
		return "", err
	}
	r := bufio.NewReaderSize(c, 512)
	line, _, err := redisReply(r)
	if err != nil {
		return "", fmt.Errorf("no answer: %w", err)
	}
	switch {
	case line == "*-1" || line == "*0" || line == "$-1":
		return "", nil
	case line == "*2":
	case strings.HasPrefix(line, "-"):
		return "", fmt.Errorf("%s", clip([]byte(line)))
	default:
		return "", fmt.Errorf("unexpected answer %q", clip([]byte(line)))
	}
	var hp [2]string
	for i := range hp {
		l, bulk, err := redisReply(r)
		if err != nil {
			return "", fmt.Errorf("truncated answer: %w", err)
		}
		if bulk == nil {
			return "", fmt.Errorf("unexpected element %q", clip([]byte(l)))
		}
		hp[i] = string(bulk)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}
