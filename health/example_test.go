package health_test

import (
	"context"

	"github.com/rs/zerolog"

	"fulcrum/backend"
	"fulcrum/health"
	"fulcrum/sched"
)

// Example runs the health controller as reload does: table reads the
// running table (the listener.Server's snapshot), rebuild makes the next
// one at the same generation after a transition, and the pool reports
// each backend's transitions on Changes. (Compiled, not run.)
func Example() {
	ctx, log := context.Background(), zerolog.Nop()
	var running *sched.Table // reload: the table of srv.Snapshot()
	table := func() *sched.Table { return running }
	rebuild := func() { /* reload: build the table again, publish it */ }

	hc := health.New(log, table, rebuild)
	var pool backend.Pool
	pool.Changes = hc.Changes()
	go hc.Run(ctx)        // until ctx ends
	var jobs []health.Job // one per checked backend of the new table
	hc.SetChecks(jobs)    // at every reload's commit, after the swap
	defer hc.Stop()       // at shutdown: ends the checks, waits for them
}
