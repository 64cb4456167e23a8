package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"fulcrum/backend"
)

// redis probes a Redis server. Without a role or password it sends PING:
// +PONG is up, and so is -NOAUTH (a live Redis that wants a password);
// -LOADING and other errors are down. With a role or a password_file it
// sends AUTH (if a password is set) and INFO replication: role:master is a
// primary, role:slave a replica, which passes a role = "replica" check only
// while master_link_status:up and within max_lag (redisLag). Either way it ends with QUIT and reads to EOF, so
// the server sees an orderly close.
//
// With Sentinels, a node that answers role:master is then asked about
// (sentinelAgrees): it is the primary only if a quorum of them name it.
//
// The commands are pipelined in one write and the replies read in order.
func (p *Probe) redis(ctx context.Context, c net.Conn) (Answer, error) {
	pw, err := p.password()
	if err != nil {
		return Answer{}, err
	}
	var cmds []byte
	if pw != "" {
		cmds = resp(cmds, "AUTH", pw)
	}
	info := p.roleWanted() || pw != "" || len(p.Sentinels) > 0
	if info {
		cmds = resp(cmds, "INFO", "replication")
	} else {
		cmds = resp(cmds, "PING")
	}
	cmds = resp(cmds, "QUIT")
	asked := time.Now() // a primary was at least where it answers from here on
	if _, err := c.Write(cmds); err != nil {
		return Answer{}, err
	}
	r := bufio.NewReaderSize(c, 4096)
	defer io.Copy(io.Discard, io.LimitReader(r, 64<<10)) // the server closes after QUIT's +OK
	if pw != "" {
		line, _, err := redisReply(r)
		if err != nil {
			return Answer{}, fmt.Errorf("no answer to AUTH: %w", err)
		}
		if line != "+OK" {
			return Answer{}, fmt.Errorf("redis AUTH: %s", clip([]byte(line)))
		}
	}
	line, bulk, err := redisReply(r)
	if err != nil {
		return Answer{}, fmt.Errorf("no answer from redis: %w", err)
	}
	if !info {
		if line == "+PONG" || strings.HasPrefix(line, "-NOAUTH") {
			return Answer{}, nil
		}
		return Answer{}, fmt.Errorf("redis answered %q", clip([]byte(line)))
	}
	if strings.HasPrefix(line, "-NOAUTH") {
		return Answer{}, fmt.Errorf("redis wants a password (set password_file): %s", clip([]byte(line)))
	}
	if bulk == nil {
		return Answer{}, fmt.Errorf("redis answered %q to INFO replication", clip([]byte(line)))
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(bulk), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok {
			fields[k] = v
		}
	}
	switch fields["role"] {
	case "master":
		a := Answer{Role: backend.RolePrimary}
		if len(p.Sentinels) > 0 && p.Role != backend.RoleReplica {
			if err := p.sentinelAgrees(ctx); err != nil {
				return a, err
			}
		}
		if off, err := strconv.ParseUint(fields["master_repl_offset"], 10, 64); err == nil {
			p.WAL.Primary(asked, 1, off) // PSYNC2 carries offsets across promotions: one history
		}
		return a.noLag(), nil // a primary lags nothing
	case "slave":
		a := Answer{Role: backend.RoleReplica}
		if st := fields["master_link_status"]; st != "up" && p.Role == backend.RoleReplica {
			return a.noLag(), fmt.Errorf("replica's link to its master %s:%s is %s", fields["master_host"], fields["master_port"], st)
		}
		if p.Role == backend.RoleReplica {
			lag, err := p.redisLag(fields)
			return p.lagVerdict(a, lag, err)
		}
		return a, nil
	}
	return Answer{}, fmt.Errorf("redis INFO replication has no role: %q", clip(bulk))
}

// redisLag measures a replica's lag, the larger of two views. Its own:
// master_last_io_seconds_ago, the time since the last byte from its
// primary, which grows while the primary is paused or the stream is stuck
// (a primary pings its replicas every repl-ping-replica-period, 10s by
// default, so an idle link reads up to that much). And the offset gap:
// how long ago the service's primary (when its check answers) was at the
// offset the replica has, so that a replica that stopped receiving while
// its primary writes falls behind by the clock.
func (p *Probe) redisLag(fields map[string]string) (time.Duration, error) {
	io, err := strconv.ParseInt(fields["master_last_io_seconds_ago"], 10, 64)
	if err != nil || io < 0 {
		return 0, errors.New("replication lag unknown: INFO replication has no master_last_io_seconds_ago")
	}
	lag := time.Duration(io) * time.Second
	if off, err := strconv.ParseUint(fields["slave_repl_offset"], 10, 64); err == nil {
		if gap, known := p.clockLag(off); known {
			lag = max(lag, gap)
		}
	}
	return lag, nil
}

// resp appends one command as a RESP array of bulk strings.
func resp(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, "\r\n"...)
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// redisReply reads one reply: the first line, and for a bulk string its
// content.
func redisReply(r *bufio.Reader) (line string, bulk []byte, err error) {
	line, err = r.ReadString('\n')
	if err != nil {
		return "", nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if !strings.HasPrefix(line, "$") {
		return line, nil, nil
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > 1<<20 {
		return line, nil, fmt.Errorf("malformed bulk length %q", line)
	}
	bulk = make([]byte, n+2)
	if _, err := io.ReadFull(r, bulk); err != nil {
		return line, nil, err
	}
	return line, bulk[:n], nil
}
