package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fulcrum/internal/testkit"
)

// The namespaces of TestSourceClient: clients on 10.77.1.0/24 (allowed by
// pg_hba.conf) and 10.77.4.0/24 (rejected by it), fulcrum between them and
// the database on 10.77.2.0/24. These addresses exist only inside the
// test's own namespaces.
var (
	srcAllowed  = netip.MustParseAddr("10.77.1.2")
	srcRejected = netip.MustParseAddr("10.77.4.2")
)

const srcDB = "10.77.2.2"

// TestSourceClient: with source = "client", a real PostgreSQL 15 in a
// namespace of its own, routed back through fulcrum's namespace (ip rule +
// a local table, and an nft socket-transparent mark), sees each client's
// own address: inet_client_addr() returns it and a pg_hba.conf subnet rule
// applies (one client subnet allowed, the other rejected), while the
// pgsql checks come from fulcrum's own address (the only one pg_hba.conf
// lets the check's user in from: a login refused would take the backend
// down, which the test never sees). With the database's route back to one
// client subnet removed, a reload is refused with the reason and the
// recipe, located at the key, and the running table keeps serving (an
// open session and a new one); with the route back, the reload applies.
func TestSourceClient(t *testing.T) {
	l := newLab(t, "src")
	needProgram(t, "nft")
	cl, lb, db := l.ns(t, "cl"), l.ns(t, "lb"), l.ns(t, "db")
	l.link(t, "v0", cl, "10.77.1.2/24", lb, "10.77.1.1/24", "10.77.4.1/24")
	l.addrs(t, cl, "v0", "10.77.4.2/24")
	l.link(t, "v1", lb, "10.77.2.1/24", db, srcDB+"/24")
	for _, subnet := range []string{"10.77.1.0/24", "10.77.4.0/24"} {
		l.ip(t, "-n", db, "route", "add", subnet, "via", "10.77.2.1")
	}
	// fulcrum's half of the recipe (docs/databases.md): replies to a
	// transparent socket are marked and delivered locally.
	l.ip(t, "-n", lb, "rule", "add", "fwmark", "1", "lookup", "100")
	l.ip(t, "-n", lb, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
	nft := exec.Command("ip", "netns", "exec", lb, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(`table inet fulcrum {
	chain divert {
		type filter hook prerouting priority mangle;
		meta l4proto tcp socket transparent 1 meta mark set 1
	}
}
`)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}

	pg := testkit.StartPostgresIn(t, db, netip.MustParseAddr(srcDB),
		"host all fulcrum 10.77.2.1/32 trust\n"+ // the checks, from fulcrum's own address only
			"host all all 10.77.1.0/24 trust\n"+
			"host all all 0.0.0.0/0 reject\n")
	pg.Exec(t, "CREATE ROLE fulcrum LOGIN")

	config := `[log]
format = "json"
access = false
[services.pg]
listen = ["10.77.1.1:5432"]
source = "client"
allow = ["10.77.1.0/24", "10.77.4.0/24"]
connect_timeout = "1s"
health = { check = "pgsql", role = "primary", interval = "1s", timeout = "1s" }
backends = [{ name = "db1", address = "` + srcDB + `:5432" }]
`
	path := writeFile(t, "fulcrum.toml", config)
	d := fulcrumIn(t, lb, path)
	d.await(t, "backend up", "backend down") // role = "primary": a backend takes connections once its role is known

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := pgFrom(ctx, cl, srcAllowed, "10.77.1.1:5432")
	if err != nil {
		t.Fatalf("connect from %s: %v", srcAllowed, err)
	}
	defer held.Close(context.Background())
	if got := clientAddr(ctx, t, held); got != srcAllowed.String() {
		t.Errorf("inet_client_addr() = %s; want the client's %s", got, srcAllowed)
	}
	if c, err := pgFrom(ctx, cl, srcRejected, "10.77.1.1:5432"); err == nil {
		c.Close(ctx)
		t.Errorf("connect from %s succeeded; want pg_hba.conf's reject of its subnet", srcRejected)
	} else if want := fmt.Sprintf("pg_hba.conf rejects connection for host %q", srcRejected); !strings.Contains(err.Error(), want) {
		t.Errorf("connect from %s: %v; want %q", srcRejected, err, want)
	}

	// The database's route back to 10.77.4.0/24 goes: the self-test's
	// connection from that prefix gets no reply, and the reload is refused.
	l.ip(t, "-n", db, "route", "del", "10.77.4.0/24")
	replaceFile(t, path, []byte(config+"# edited: the route back to 10.77.4.0/24 is gone\n"))
	m := d.awaitMatch(t, "the refusal", func(m map[string]any) bool {
		msg, _ := m["message"].(string)
		return strings.HasPrefix(msg, "reload refused, generation 1 keeps serving")
	}, "backend down")
	got := fmt.Sprint(m["errors"])
	t.Logf("the refusal: %s", got)
	for _, want := range []string{
		path + ":6: services.pg.source:", // located at the key
		"backend db1 (" + srcDB + ":5432)",
		"client address 10.77.4.254",
		"ip route add 10.77.4.0/24 via 10.77.2.1", // the database host's half, with fulcrum's address
		"socket transparent 1 meta mark set 1",    // fulcrum's half
		"ip rule add fwmark 1 lookup 100",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("refusal %s; want it to hold %q", got, want)
		}
	}
	if strings.Contains(got, "10.77.1.254") {
		t.Errorf("refusal %s names the prefix whose route is there", got)
	}
	// The running table keeps serving: the open session, and a new one.
	if got := clientAddr(ctx, t, held); got != srcAllowed.String() {
		t.Errorf("held session after the refusal: inet_client_addr() = %s; want %s", got, srcAllowed)
	}
	c, err := pgFrom(ctx, cl, srcAllowed, "10.77.1.1:5432")
	if err != nil {
		t.Fatalf("connect after the refused reload: %v", err)
	}
	if got := clientAddr(ctx, t, c); got != srcAllowed.String() {
		t.Errorf("new session after the refusal: inet_client_addr() = %s; want %s", got, srcAllowed)
	}
	c.Close(ctx)

	l.ip(t, "-n", db, "route", "add", "10.77.4.0/24", "via", "10.77.2.1")
	replaceFile(t, path, []byte(config+"# edited: the route is back\n"))
	d.await(t, "reload applied", "reload refused, generation 1 keeps serving: 1 problems", "backend down")
}

// TestSourceClientNoCapability: without CAP_NET_ADMIN (and CAP_NET_RAW,
// which also allows IP_TRANSPARENT), a file with source = "client" is
// refused at start with the reason and the drop-in to install, not served
// into connect timeouts.
func TestSourceClientNoCapability(t *testing.T) {
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "dropping a capability needs root's to drop")
	}
	setpriv := needProgram(t, "setpriv")
	path := writeFile(t, "fulcrum.toml", `[log]
format = "json"
[services.pg]
listen = ["127.0.0.1:0"]
source = "client"
backends = [{ address = "127.0.0.1:5432" }]
`)
	d := startDaemonArgs(t, []string{"-c", `exec "$0" --bounding-set=-net_admin,-net_raw "$1" -config "$2"`, setpriv, bin, path}, nil, nil)
	m := d.await(t, "cannot start")
	for _, want := range []string{path + ":5: services.pg.source:", "needs CAP_NET_ADMIN", "transparent.conf"} {
		if !strings.Contains(fmt.Sprint(m["error"]), want) {
			t.Errorf("cannot start: %v; want it to hold %q", m["error"], want)
		}
	}
	select {
	case <-d.exit:
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not exit within 10s of refusing its file")
	}
}

// pgFrom connects as postgres to addr from address from in namespace ns.
func pgFrom(ctx context.Context, ns string, from netip.Addr, addr string) (*pgconn.PgConn, error) {
	host, port, _ := net.SplitHostPort(addr)
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable connect_timeout=10", host, port))
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(ns, func() error {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

// clientAddr is inet_client_addr() on session c, without its prefix length.
func clientAddr(ctx context.Context, t *testing.T, c *pgconn.PgConn) string {
	t.Helper()
	res, err := c.Exec(ctx, "SELECT host(inet_client_addr())").ReadAll()
	if err != nil || len(res) == 0 || len(res[0].Rows) == 0 {
		t.Fatalf("SELECT inet_client_addr(): %v", err)
	}
	return string(res[0].Rows[0][0])
}
