package health

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
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
//
// A failover moves faster than the majority: the named master stops being
// the primary as soon as one Sentinel reports that it is failing it over
// (the old master would acknowledge writes that its resync erases, before
// the others name the new one), and the replica that Sentinel promoted is
// the primary as soon as that Sentinel names it.
func (p *Probe) sentinelAgrees(ctx context.Context) error {
	answers := make([]string, len(p.Sentinels)) // the address named, or "error: …"
	failing := make([]string, len(p.Sentinels)) // the address being failed over, or ""
	var wg sync.WaitGroup
	for i, s := range p.Sentinels {
		wg.Go(func() { // exits when its exchange ends, at the latest at the probe's deadline
			addr, f, err := p.sentinelMaster(ctx, s)
			if err != nil {
				answers[i] = "error: " + err.Error()
				return
			}
			answers[i], failing[i] = addr, f
		})
	}
	wg.Wait()
	for i, f := range failing {
		if f != "" && sameAddr(f, p.Backend) {
			// The Sentinel leading a failover (SENTINEL FAILOVER, or a
			// master it sees down) promotes a replica; from then on this
			// master's writes are erased at its resync, and no Sentinel
			// fences it.
			return &WrongRoleError{Observed: "the master that Sentinel " + p.Sentinels[i] + " is failing over", Want: p.wantName()}
		}
	}
	for i, f := range failing {
		if f != "" && !sameAddr(answers[i], f) && sameAddr(answers[i], p.Backend) {
			// That Sentinel names the replica it promoted once the
			// promotion is final (failover state reconf-slaves on), seconds
			// before the others hear of it.
			return nil
		}
	}
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

// sentinelMaster asks one Sentinel, in one round trip, for MasterName's
// address (get-master-addr-by-name; "" when it knows no such master: a
// null array) and, when it is failing that master over
// (failover_in_progress in SENTINEL MASTER's flags), the address of the
// master it is failing over: SENTINEL MASTER's ip and port, which stay
// the old master's until the failover ends, while get-master-addr-by-name
// already names the promoted replica once its promotion is final.
func (p *Probe) sentinelMaster(ctx context.Context, addr string) (master, failingOver string, err error) {
	c, err := p.netDialer().DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // a cancelled probe unblocks at once
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	cmds := resp(nil, "SENTINEL", "get-master-addr-by-name", p.MasterName)
	cmds = resp(cmds, "SENTINEL", "MASTER", p.MasterName)
	if _, err := c.Write(cmds); err != nil {
		return "", "", err
	}
	r := bufio.NewReaderSize(c, 4096)
	hp, err := redisArray(r, 2)
	if err != nil {
		return "", "", err
	}
	list, err := redisArray(r, 256)
	if err != nil && hp != nil {
		return "", "", fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	fields := map[string]string{}
	for i := 0; i+1 < len(list); i += 2 {
		fields[list[i]] = list[i+1]
	}
	if slices.Contains(strings.Split(fields["flags"], ","), "failover_in_progress") && fields["ip"] != "" {
		failingOver = net.JoinHostPort(fields["ip"], fields["port"])
	}
	if hp == nil {
		return "", failingOver, nil
	}
	if len(hp) != 2 {
		return "", "", fmt.Errorf("unexpected answer %q", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), failingOver, nil
}

// redisArray reads one reply that must be an array of at most max bulk
// strings or integers (a Sentinel's answer, a pub/sub message or
// subscription, a subscriber's pong), as strings; a null or empty array is
// nil. An error reply is an error.
func redisArray(r *bufio.Reader, max int) ([]string, error) {
	line, _, err := redisReply(r)
	if err != nil {
		return nil, fmt.Errorf("no answer: %w", err)
	}
	if strings.HasPrefix(line, "-") {
		return nil, fmt.Errorf("%s", clip([]byte(line)))
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("unexpected answer %q", clip([]byte(line)))
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n > max {
		return nil, fmt.Errorf("unexpected answer %q", clip([]byte(line)))
	}
	var out []string
	for range n {
		l, bulk, err := redisReply(r)
		switch {
		case err != nil:
			return nil, fmt.Errorf("truncated answer: %w", err)
		case bulk != nil:
			out = append(out, string(bulk))
		case strings.HasPrefix(l, ":"):
			out = append(out, l[1:])
		default:
			return nil, fmt.Errorf("unexpected element %q", clip([]byte(l)))
		}
	}
	return out, nil
}
