package health

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// TestGalera: three mariadbd nodes of galera-4 on loopback. A role
// "galera" check passes on each Synced node; wsrep_desync = ON takes a
// node out within fall × interval (as donor) and OFF brings it back;
// wsrep_reject_queries = ALL is out; a node left alone when the other two
// die is non-primary.
func TestGalera(t *testing.T) {
	nodes := testkit.StartGalera(t, 3)
	pw := secret(t, testkit.MD5Password)
	mk := func(m *testkit.MariaDB) *Probe {
		return &Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: RoleGalera}
	}
	for i, m := range nodes {
		if err := mk(m).Run(t.Context()); err != nil {
			t.Fatalf("node %d synced: %v; want up", i+1, err)
		}
	}
	// Also read_only = OFF everywhere: role = "primary" sees three primaries.
	for i, m := range nodes {
		if role, err := (&Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: backend.RolePrimary}).Check(t.Context()); err != nil || role != backend.RolePrimary {
			t.Errorf("node %d role primary: %q, %v", i+1, role, err)
		}
	}

	// Desync under live checks: down within fall × interval.
	const interval, fall = 200 * time.Millisecond, 2
	changes := make(chan *backend.Backend, 16)
	pool := backend.Pool{Changes: changes}
	b := pool.Get("galera", "node2")
	spec := CheckSpec{Probe: *mk(nodes[1]), Interval: interval, Rise: 1, Fall: fall}
	spec.Probe.Timeout = interval
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); RunChecks(ctx, b, spec) }() // exits when ctx is cancelled
	defer func() { cancel(); <-done }()

	nodes[1].Exec(t, "SET GLOBAL wsrep_desync = ON")
	start := time.Now()
	awaitState(t, changes, b, true, 30*time.Second)
	took := time.Since(start)
	_, reason, _ := b.Health()
	t.Logf("wsrep_desync = ON: down after %s (fall × interval = %s): %s", took.Round(time.Millisecond), fall*interval, reason)
	if !strings.Contains(reason, "donor") {
		t.Errorf("reason %q; want it to name the donor state", reason)
	}
	if limit := fall*interval + 2*interval + time.Second; took > limit {
		t.Errorf("down after %s; want within fall × interval (%s, %s with margins)", took, fall*interval, limit)
	}
	nodes[1].Exec(t, "SET GLOBAL wsrep_desync = OFF")
	awaitState(t, changes, b, false, 30*time.Second)

	nodes[2].Exec(t, "SET GLOBAL wsrep_reject_queries = ALL")
	if err := mk(nodes[2]).Run(t.Context()); err == nil || !strings.Contains(err.Error(), "rejects queries") {
		t.Errorf("wsrep_reject_queries = ALL: %v; want down, rejecting queries", err)
	}
	nodes[2].Exec(t, "SET GLOBAL wsrep_reject_queries = NONE")

	// Two of three die: the survivor loses the quorum.
	nodes[1].Kill()
	nodes[2].Kill()
	var err error
	// The survivor notices at evs.suspect_timeout; no event tells the test.
	testkit.WaitFor(t, 60*time.Second, func() error {
		if err = mk(nodes[0]).Run(t.Context()); err == nil || !strings.Contains(err.Error(), "non-primary") {
			return fmt.Errorf("the survivor of three: %v; want non-primary", err)
		}
		return nil
	})
	t.Logf("survivor: %v", err)
}

// awaitState waits for b's change report until it is down (or up).
func awaitState(t *testing.T, changes <-chan *backend.Backend, b *backend.Backend, down bool, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for b.Down() != down {
		select {
		case <-changes:
			b.Seen()
		case <-deadline:
			_, reason, _ := b.Health()
			t.Fatalf("Down() = %v after %s (%s); want %v", !down, within, reason, down)
		}
	}
}
