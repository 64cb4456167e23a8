package testkit

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"
)

// StartPostgresIn starts a primary as StartPostgres does (no fsync, as the
// postgres user), but inside network namespace ns (one the test made),
// listening on addr, an address of ns, port 5432; hba is its pg_hba.conf
// for TCP, after "local all all trust" (Exec goes over the Unix socket,
// which is no namespace's). The test's cleanup stops it.
func StartPostgresIn(t testing.TB, ns string, addr netip.Addr, hba string) *Postgres {
	t.Helper()
	bin := pgBin()
	if bin == "" {
		missing(t, "PostgreSQL")
	}
	root := pgRoot(t)
	p := &Postgres{Port: 5432, root: root, bin: bin, Dir: filepath.Join(root, "data"), Log: filepath.Join(root, "log")}
	p.Addr = netip.AddrPortFrom(addr, 5432).String()
	runAs(t, bin+"/initdb", "-D", p.Dir, "--auth=trust", "--no-sync", "-U", "postgres")
	p.configure(t)
	appendFile(t, filepath.Join(p.Dir, "postgresql.conf"), fmt.Sprintf("listen_addresses = '%s'\n", addr))
	writeFile(t, filepath.Join(p.Dir, "pg_hba.conf"), "local all all trust\n"+hba)
	run(t, "chown", "postgres:postgres", filepath.Join(p.Dir, "pg_hba.conf"))
	out, err := exec.Command("ip", "netns", "exec", ns, "runuser", "-u", "postgres", "--",
		bin+"/pg_ctl", "-D", p.Dir, "start", "-w", "-t", "60", "-l", p.Log).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_ctl start in %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}
