package testkit

// Orchestrated databases for failover tests: a Patroni cluster (etcd and
// PostgreSQL nodes, each under its own Patroni) and a Redis Sentinel setup
// (a master, replicas and three Sentinels). Everything listens on
// 127.0.0.0/8, lives in temporary directories and is stopped by the test's
// cleanup, down to the last postmaster a killed Patroni left behind.
//
//	pc := testkit.StartPatroni(t, 3)       // etcd + 3 nodes, one leader, replicas streaming
//	leader := pc.Leader(t)
//	pc.Switchover(t, leader, pc.Nodes[1])
//	pc.KillPatroni(t, leader)              // kill -9 of Patroni; PostgreSQL runs on
//
//	ss := testkit.StartSentinel(t, 2)      // master + 2 replicas, 3 Sentinels, quorum 2
//	ss.Failover(t)                         // SENTINEL FAILOVER
//
// As with the other servers, a test whose programs are not installed
// skips, except under CI=true, where it fails.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Patroni timing: a short leader lock, so that a failover takes seconds.
// Patroni wants loop_wait + 2 × retry_timeout ≤ ttl.
const (
	PatroniTTL   = 10 * time.Second
	patroniLoop  = 1
	patroniRetry = 4
)

// PatroniCluster is etcd and a set of PostgreSQL nodes, each run by its
// own Patroni, in scope "fulcrum". Every node trusts 127.0.0.1 for every
// user (postgres is the superuser).
type PatroniCluster struct {
	Nodes []*PatroniNode
	Etcd  string // etcd's client address on 127.0.0.1
	root  string
	bin   string
	etcd  *proc
}

// PatroniNode is one PostgreSQL server and its Patroni.
type PatroniNode struct {
	Name     string
	Addr     string // PostgreSQL, 127.0.0.1:port
	Port     int
	REST     string // Patroni's REST API, 127.0.0.1:port
	RESTPort int
	EtcdAddr string // the address this node's Patroni reaches etcd on: 127.0.33.N:port, its own, so that it can be cut off alone
	Dir      string // data directory
	Log      string // Patroni's output (and PostgreSQL's, which Patroni does not redirect)
	conf     string
	patroni  *proc
}

// proc is a child process and the end of its Wait.
type proc struct {
	cmd  *exec.Cmd
	log  string // where its output goes
	done chan struct{}
}

func startProc(t testing.TB, logPath string, setpgid bool, name string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: setpgid}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("%s: %v", name, err)
	}
	f.Close() // the child has its own copy
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }() // exits with the process
	return p
}

// kill sends SIGKILL to the process (and, with group, to its process
// group) and waits for it.
func (p *proc) kill(group bool) {
	if p == nil {
		return
	}
	if group {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// needPrograms skips (or under CI fails) unless every program is found.
func needPrograms(t testing.TB, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			missing(t, p)
		}
	}
}

// StartPatroni starts etcd and n Patroni nodes and waits until one is the
// leader and the others stream from it.
func StartPatroni(t testing.TB, n int) *PatroniCluster {
	t.Helper()
	needPrograms(t, "patroni", "etcd", "setpriv")
	bin := pgBin()
	if bin == "" {
		missing(t, "PostgreSQL")
	}
	root := pgRoot(t)
	c := &PatroniCluster{root: root, bin: bin}
	// etcd takes its client port on 127.0.33.N too, one address per node.
	hosts := []string{"127.0.0.1"}
	for i := range n {
		hosts = append(hosts, fmt.Sprintf("127.0.33.%d", i+1))
	}
	ep, pp := freePortOn(t, hosts...), freePort(t)
	c.Etcd = fmt.Sprintf("127.0.0.1:%d", ep)
	listen := []string{"http://" + c.Etcd}
	for i := range n {
		listen = append(listen, fmt.Sprintf("http://127.0.33.%d:%d", i+1, ep))
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	c.etcd = startProc(t, filepath.Join(root, "etcd.log"), false, "etcd", "--name", "fulcrum", "--data-dir", filepath.Join(root, "etcd"),
		"--listen-client-urls", strings.Join(listen, ","), "--advertise-client-urls", "http://"+c.Etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "fulcrum="+peer,
		"--initial-cluster-state", "new", "--log-level", "warn")
	t.Cleanup(c.stop) // registered now: a failure below still stops what started
	waitHTTP(t, c.etcd, "http://"+c.Etcd+"/health", 30*time.Second)
	for i := range n {
		nd := &PatroniNode{Name: fmt.Sprintf("pg%d", i+1), Port: freePort(t), RESTPort: freePort(t)}
		nd.Addr = fmt.Sprintf("127.0.0.1:%d", nd.Port)
		nd.REST = fmt.Sprintf("127.0.0.1:%d", nd.RESTPort)
		nd.EtcdAddr = fmt.Sprintf("127.0.33.%d:%d", i+1, ep)
		nd.Dir = filepath.Join(root, "data"+strconv.Itoa(i+1))
		nd.Log = filepath.Join(root, nd.Name+".log")
		nd.conf = filepath.Join(root, nd.Name+".yml")
		sock := filepath.Join(root, "sock"+strconv.Itoa(i+1))
		if err := os.Mkdir(sock, 0o755); err != nil {
			t.Fatal(err)
		}
		run(t, "chown", "postgres:postgres", sock)
		writeFile(t, nd.conf, patroniYAML(nd, sock, filepath.Join(root, "pgpass"+strconv.Itoa(i+1)), bin))
		os.Chmod(nd.conf, 0o644)
		c.Nodes = append(c.Nodes, nd)
	}
	for _, nd := range c.Nodes {
		c.StartPatroni(t, nd)
	}
	c.WaitHealthy(t, 120*time.Second)
	return c
}

func patroniYAML(nd *PatroniNode, sock, pgpass, bin string) string {
	return fmt.Sprintf(`scope: fulcrum
namespace: /service/
name: %s
log:
  level: INFO
restapi:
  listen: %s
  connect_address: %s
etcd3:
  hosts: %s
  use_proxies: true
watchdog:
  mode: off
bootstrap:
  dcs:
    ttl: %d
    loop_wait: %d
    retry_timeout: %d
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 64MB
        max_connections: 100
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
postgresql:
  listen: %s
  connect_address: %s
  data_dir: %s
  bin_dir: %s
  pgpass: %s
  basebackup:
  - checkpoint: fast
  authentication:
    replication: {username: replicator, password: replsecret}
    superuser: {username: postgres, password: supersecret}
  parameters:
    unix_socket_directories: '%s'
    fsync: 'off'
    shared_buffers: 16MB
    log_connections: 'off'
    log_disconnections: 'off'
  pg_hba:
  - local all all trust
  - host replication replicator 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
`, nd.Name, nd.REST, nd.REST, nd.EtcdAddr, int(PatroniTTL/time.Second), patroniLoop, patroniRetry,
		nd.Addr, nd.Addr, nd.Dir, bin, pgpass, sock)
}

// StartPatroni starts (or, after KillPatroni, restarts, as a supervisor
// would) the node's Patroni, as the postgres user.
func (c *PatroniCluster) StartPatroni(t testing.TB, nd *PatroniNode) {
	t.Helper()
	nd.patroni = startProc(t, nd.Log, true, "setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--reset-env",
		"patroni", nd.conf)
}

// KillPatroni kills the node's Patroni with SIGKILL; its PostgreSQL runs on
// (there is no watchdog).
func (c *PatroniCluster) KillPatroni(t testing.TB, nd *PatroniNode) {
	t.Helper()
	nd.patroni.kill(false)
}

// Postmaster returns the pid of the node's running postmaster.
func (nd *PatroniNode) Postmaster(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nd.Dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid of %s: %q", nd.Name, first)
	}
	return pid
}

// KillPostmaster kills the node's postmaster with SIGKILL; Patroni restarts
// it.
func (c *PatroniCluster) KillPostmaster(t testing.TB, nd *PatroniNode) {
	t.Helper()
	if err := syscall.Kill(nd.Postmaster(t), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// Partition cuts the node's Patroni off from etcd, and etcd alone: packets
// between its own etcd address (EtcdAddr) and etcd are dropped on the
// loopback interface, so that Patroni sees timeouts as behind a real
// partition. heal removes the rules; the test's cleanup does too.
func (c *PatroniCluster) Partition(t testing.TB, nd *PatroniNode) (heal func()) {
	t.Helper()
	needPrograms(t, "iptables")
	host, port, _ := net.SplitHostPort(nd.EtcdAddr)
	rules := [][]string{
		{"INPUT", "-i", "lo", "-p", "tcp", "-d", host, "--dport", port, "-j", "DROP"},
		{"INPUT", "-i", "lo", "-p", "tcp", "-s", host, "--sport", port, "-j", "DROP"},
	}
	for _, r := range rules {
		run(t, "iptables", append([]string{"-I"}, r...)...)
	}
	healed := false
	heal = func() {
		if healed {
			return
		}
		healed = true
		for _, r := range rules {
			exec.Command("iptables", append([]string{"-D"}, r...)...).Run()
		}
	}
	t.Cleanup(heal)
	return heal
}

// Member is one node as Patroni's GET /cluster describes it.
type Member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`  // "leader", "replica", "sync_standby"…
	State string `json:"state"` // "running", "streaming", "starting"…
	Lag   any    `json:"lag"`   // bytes behind, or "unknown"
	TL    int    `json:"timeline"`
}

// Members asks the first node whose REST API answers for the cluster's
// members; nil when none answers.
func (c *PatroniCluster) Members() []Member {
	for _, nd := range c.Nodes {
		var out struct {
			Members []Member `json:"members"`
		}
		if err := getJSON(nd.REST, "/cluster", &out); err == nil {
			return out.Members
		}
	}
	return nil
}

// LeaderName is the member holding the leader lock, read from etcd's
// leader key (as patronictl does), or "" when none holds it.
func (c *PatroniCluster) LeaderName() string {
	key := base64.StdEncoding.EncodeToString([]byte("/service/fulcrum/leader"))
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Post("http://"+c.Etcd+"/v3/kv/range", "application/json", strings.NewReader(`{"key": "`+key+`"}`))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		Kvs []struct {
			Value string `json:"value"`
		} `json:"kvs"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out) != nil || len(out.Kvs) == 0 {
		return ""
	}
	v, _ := base64.StdEncoding.DecodeString(out.Kvs[0].Value)
	return string(v)
}

// Node returns the node of that name.
func (c *PatroniCluster) Node(name string) *PatroniNode {
	for _, nd := range c.Nodes {
		if nd.Name == name {
			return nd
		}
	}
	return nil
}

// Leader waits (up to a minute) for a leader that runs as a primary and
// returns it.
func (c *PatroniCluster) Leader(t testing.TB) *PatroniNode {
	t.Helper()
	var leader *PatroniNode
	WaitFor(t, time.Minute, func() error { // an election gives no event but its result
		if leader = c.Node(c.LeaderName()); leader != nil {
			if rows, err := Query(leader.Addr, "SELECT pg_is_in_recovery()"); err == nil && rows[0][0] == "f" {
				return nil
			}
		}
		return fmt.Errorf("no Patroni leader running as a primary: %+v", c.Members())
	})
	return leader
}

// WaitHealthy waits until there is a leader running as a primary and every
// other node streams from it (pg_stat_replication), and each node's
// Patroni answers.
func (c *PatroniCluster) WaitHealthy(t testing.TB, within time.Duration) *PatroniNode {
	t.Helper()
	var leader *PatroniNode
	err := Until(within, func() error { // a cluster gives no event for its health but each part's answer
		for _, nd := range c.Nodes {
			if nd.patroni == nil || nd.patroni.exited() {
				t.Fatalf("patroni %s exited\n%s", nd.Name, c.logTail())
			}
		}
		if leader = c.Node(c.LeaderName()); leader == nil {
			return errors.New("no leader")
		}
		rows, err := Query(leader.Addr, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
		if err != nil {
			return err
		}
		if rows[0][0] != strconv.Itoa(len(c.Nodes)-1) {
			return fmt.Errorf("%s replicas streaming; want %d", rows[0][0], len(c.Nodes)-1)
		}
		for _, nd := range c.Nodes {
			var st map[string]any
			if err := getJSON(nd.REST, "/patroni", &st); err != nil || st["state"] != "running" {
				return fmt.Errorf("%s: %v %v", nd.Name, st["state"], err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the Patroni cluster is not healthy: %v; members %+v\n%s", err, c.Members(), c.logTail())
	}
	return leader
}

// Switchover asks the leader's Patroni to hand the lock to candidate, as
// patronictl switchover does, and returns once Patroni has taken the
// request.
func (c *PatroniCluster) Switchover(t testing.TB, leader, candidate *PatroniNode) {
	t.Helper()
	body := fmt.Sprintf(`{"leader": %q, "candidate": %q}`, leader.Name, candidate.Name)
	req, err := http.NewRequest("POST", "http://"+leader.REST+"/switchover", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	cl := &http.Client{Timeout: 60 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("switchover %s → %s: %v", leader.Name, candidate.Name, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("switchover %s → %s: %s: %s", leader.Name, candidate.Name, resp.Status, b)
	}
}

// logTail is the end of every node's log, for a failure message.
func (c *PatroniCluster) logTail() string {
	var b strings.Builder
	for _, nd := range c.Nodes {
		out, _ := os.ReadFile(nd.Log)
		fmt.Fprintf(&b, "--- %s\n%s\n", nd.Name, tail(out, 2000))
	}
	return b.String()
}

// stop is the cleanup: every Patroni (and its process group) first, so
// none restarts a PostgreSQL, then every PostgreSQL still running (one a
// killed Patroni left behind runs outside that group's control), then etcd.
func (c *PatroniCluster) stop() {
	for _, nd := range c.Nodes {
		nd.patroni.kill(true)
	}
	for _, nd := range c.Nodes {
		if _, err := os.Stat(filepath.Join(nd.Dir, "postmaster.pid")); err == nil {
			exec.Command("runuser", "-u", "postgres", "--", c.bin+"/pg_ctl", "-D", nd.Dir, "stop", "-m", "immediate", "-w").Run()
		}
	}
	c.etcd.kill(false)
}

// waitHTTP waits for GET url to answer 200 while p runs.
func waitHTTP(t testing.TB, p *proc, url string, within time.Duration) {
	t.Helper()
	cl := &http.Client{Timeout: time.Second}
	WaitFor(t, within, func() error { // a starting server gives no event but its answer
		resp, err := cl.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if p.exited() {
			out, _ := os.ReadFile(p.log)
			t.Fatalf("%s exited (%v) before %s answered; the end of its output:\n%s", p.cmd.Path, p.cmd.ProcessState, url, tail(out, 2000))
		}
		return fmt.Errorf("GET %s: %w; want 200", url, err)
	})
}

// getJSON decodes GET http://addr+path (any status) into v.
func getJSON(addr, path string, v any) error {
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// RESTStatus is the status of GET path on a Patroni REST API (0 when it
// does not answer).
func RESTStatus(addr, path string) int {
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Query runs sql as postgres over TCP (trust) on addr and returns the rows
// of the last statement, as text.
func Query(addr, sql string) ([][]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(res) == 0 || len(res[len(res)-1].Rows) == 0 {
		return nil, errors.New("no rows")
	}
	var rows [][]string
	for _, r := range res[len(res)-1].Rows {
		row := make([]string, len(r))
		for i, v := range r {
			row[i] = string(v)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// SentinelSet is a Redis master, its replicas and three Sentinels watching
// it as "mymaster" with quorum 2 (down after 2 s).
type SentinelSet struct {
	Name      string   // the master's name: "mymaster"
	Redis     []*Redis // the first is the first master
	Sentinels []string // 127.0.0.1:port of each Sentinel
	procs     []*proc
}

// StartSentinel starts a master, replicas replicas of it and three
// Sentinels, and waits until every Sentinel knows every replica and the
// other Sentinels.
func StartSentinel(t testing.TB, replicas int) *SentinelSet {
	t.Helper()
	needPrograms(t, "redis-server", "redis-sentinel")
	s := &SentinelSet{Name: "mymaster"}
	m := StartRedis(t)
	s.Redis = append(s.Redis, m)
	for range replicas {
		s.Redis = append(s.Redis, StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(m.Port)))
	}
	t.Cleanup(func() {
		for _, p := range s.procs {
			p.kill(false)
		}
	})
	dir := t.TempDir()
	for i := range 3 {
		port := freePort(t)
		conf := filepath.Join(dir, fmt.Sprintf("s%d.conf", i+1))
		writeFile(t, conf, fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %s\n"+
			"sentinel resolve-hostnames no\nsentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %[3]s 2000\n"+
			"sentinel failover-timeout %[3]s 10000\nsentinel parallel-syncs %[3]s 1\n", port, dir, s.Name, m.Port))
		s.procs = append(s.procs, startProc(t, filepath.Join(dir, fmt.Sprintf("s%d.log", i+1)), false, "redis-sentinel", conf))
		s.Sentinels = append(s.Sentinels, fmt.Sprintf("127.0.0.1:%d", port))
	}
	s.WaitSettled(t, replicas, 60*time.Second)
	return s
}

// WaitSettled waits until every Sentinel names the same master and knows
// replicas replicas of it (with their link up) and the two other Sentinels.
func (s *SentinelSet) WaitSettled(t testing.TB, replicas int, within time.Duration) {
	t.Helper()
	WaitFor(t, within, func() error { // Sentinels give no event for agreeing but their answers
		for _, sn := range s.Sentinels {
			v, err := RedisDo(sn, "SENTINEL", "MASTER", s.Name)
			if err != nil {
				return fmt.Errorf("the Sentinels have not settled: %s: %w", sn, err)
			}
			f := pairs(v)
			if f["num-slaves"] != strconv.Itoa(replicas) || f["num-other-sentinels"] != "2" || f["flags"] != "master" {
				return fmt.Errorf("the Sentinels have not settled: %s: flags %s, %s replicas, %s other sentinels", sn, f["flags"], f["num-slaves"], f["num-other-sentinels"])
			}
		}
		master := s.Master()
		if master == "" {
			return errors.New("the Sentinels have not settled: no master named by a majority")
		}
		info, err := RedisDo(master, "INFO", "replication")
		if str, _ := info.(string); err != nil || !strings.Contains(str, "connected_slaves:"+strconv.Itoa(replicas)) {
			return fmt.Errorf("the Sentinels have not settled: master %s: %v %q", master, err, info)
		}
		for _, r := range s.Redis {
			if r.Addr == master {
				continue
			}
			info, err := RedisDo(r.Addr, "INFO", "replication")
			if str, _ := info.(string); err != nil || !strings.Contains(str, "master_link_status:up") {
				return fmt.Errorf("the Sentinels have not settled: replica %s: link not up: %v", r.Addr, err)
			}
		}
		return nil
	})
}

// pairs reads a flat array of field/value bulk strings.
func pairs(v any) map[string]string {
	a, _ := v.([]any)
	out := map[string]string{}
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		v, _ := a[i+1].(string)
		out[k] = v
	}
	return out
}

// Master is the address a majority of the Sentinels name as the master,
// or "".
func (s *SentinelSet) Master() string {
	votes := map[string]int{}
	for _, sn := range s.Sentinels {
		v, err := RedisDo(sn, "SENTINEL", "get-master-addr-by-name", s.Name)
		if a, ok := v.([]any); err == nil && ok && len(a) == 2 {
			h, _ := a[0].(string)
			p, _ := a[1].(string)
			votes[net.JoinHostPort(h, p)]++
		}
	}
	for a, n := range votes {
		if n > len(s.Sentinels)/2 {
			return a
		}
	}
	return ""
}

// ByAddr returns the server at addr.
func (s *SentinelSet) ByAddr(addr string) *Redis {
	for _, r := range s.Redis {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// Failover sends SENTINEL FAILOVER to the first Sentinel.
func (s *SentinelSet) Failover(t testing.TB) {
	t.Helper()
	v, err := RedisDo(s.Sentinels[0], "SENTINEL", "FAILOVER", s.Name)
	if err != nil || v != "OK" {
		t.Fatalf("SENTINEL FAILOVER: %v %v", v, err)
	}
}

// RedisError is an error reply.
type RedisError string

func (e RedisError) Error() string { return string(e) }

// RedisDo sends one command to addr and returns its reply: a string for a
// simple or bulk string, an int64, a []any, nil for a null, or a
// RedisError.
func RedisDo(addr string, args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(RESP(args...)); err != nil {
		return nil, err
	}
	v, err := ReadRESP(bufio.NewReader(c))
	if re, ok := v.(RedisError); ok && err == nil {
		return nil, re
	}
	return v, err
}

// RESP encodes one command as an array of bulk strings.
func RESP(args ...string) []byte {
	b := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// ReadRESP reads one reply (see RedisDo); an error reply is returned as a
// RedisError value, not as the error.
func ReadRESP(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return RedisError(line[1:]), nil
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = ReadRESP(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}
