package cluster_test

import (
	"fmt"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/cluster"
	"fulcrum/sched"
)

// Example decides what /healthz answers. main passes a func that reads the
// table from the listener.Server's snapshot (Server.Snapshot), and runs
// inst.Run(ctx, usr1usr2) so that SIGUSR1 drains and SIGUSR2 undrains.
func Example() {
	ts := []sched.Target{{B: backend.New("pg", "a"), Weight: 1, Base: 1}}
	tbl := sched.NewTable(1, []*sched.Service{{Name: "pg", Targets: ts}}, nil)
	inst := cluster.New(func() *sched.Table { return tbl }, zerolog.Nop())

	fmt.Println(inst.Healthy())
	inst.Drain("POST /drain")
	ok, _ := inst.Healthy() // the reason says since when
	by, _, _ := inst.Drained()
	fmt.Println(ok, by)
	inst.Undrain("POST /undrain")
	fmt.Println(inst.Healthy())
	// Output:
	// true ok
	// false POST /drain
	// true ok
}
