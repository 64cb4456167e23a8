package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// galeraProvider is Debian's galera-4 library.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// StartGalera starts a Galera Cluster of n mariadbd nodes on loopback
// (gcomm://127.0.0.1:…, state transfers by rsync): the first bootstraps
// the cluster, the others join it one after another, and each is Synced
// before StartGalera returns. The users of StartMariaDB are created once,
// on the first node, and replicate. The test's cleanup stops every node.
func StartGalera(t testing.TB, n int) []*MariaDB {
	t.Helper()
	if _, err := os.Stat(galeraProvider); err != nil {
		missing(t, "galera-4 ("+galeraProvider+")")
	}
	gcomm := make([]int, n)
	var peers []string
	for i := range gcomm {
		gcomm[i] = freePort(t)
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", gcomm[i]))
	}
	nodes := make([]*MariaDB, n)
	for i := range nodes {
		ist, sst := freePort(t), freePort(t)
		args := []string{"--wsrep-on=ON", "--wsrep-provider=" + galeraProvider,
			"--wsrep-cluster-name=fulcrum-test", "--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
			fmt.Sprintf("--wsrep-node-name=node%d", i+1), fmt.Sprintf("--wsrep-node-address=127.0.0.1:%d", gcomm[i]),
			fmt.Sprintf("--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;gcache.size=16M;evs.inactive_timeout=PT6S;evs.suspect_timeout=PT3S", gcomm[i], ist),
			fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", sst), "--wsrep-sst-method=rsync",
			"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2", "--default-storage-engine=InnoDB"}
		if i == 0 {
			args = append(args, "--wsrep-new-cluster")
		}
		nodes[i] = startMariaDB(t, args...)
		nodes[i].WaitGalera(t, "4", 120*time.Second)
		if i == 0 {
			nodes[0].Exec(t, "CREATE USER fulcrum@'%'")
			nodes[0].Exec(t, "CREATE USER checker@'%' IDENTIFIED BY '"+MD5Password+"'")
		}
	}
	return nodes
}

// WaitGalera waits until the node's wsrep_local_state is state ("4":
// Synced) and it is in the primary component.
func (m *MariaDB) WaitGalera(t testing.TB, state string, within time.Duration) {
	t.Helper()
	err := Until(within, func() error { // a node gives no event for its state but the status itself
		var k, got, status string
		if err := m.db.QueryRow("SHOW GLOBAL STATUS LIKE 'wsrep_local_state'").Scan(&k, &got); err != nil {
			return err
		}
		if err := m.db.QueryRow("SHOW GLOBAL STATUS LIKE 'wsrep_cluster_status'").Scan(&k, &status); err != nil {
			return err
		}
		if got != state || status != "Primary" {
			return fmt.Errorf("wsrep_local_state %q, cluster %q; want %s in Primary", got, status, state)
		}
		return nil
	})
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(m.Dir), "err.log"))
		t.Fatalf("galera node %s: %v\n%s", m.Addr, err, tail(b, 3000))
	}
}

// Kill stops the server with SIGKILL and waits for it.
func (m *MariaDB) Kill() {
	m.cmd.Process.Kill()
	<-m.done
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
