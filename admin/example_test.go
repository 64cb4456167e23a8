package admin_test

import (
	"context"
	"net"

	"github.com/rs/zerolog"

	"fulcrum/admin"
	"fulcrum/cluster"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/sched"
	"fulcrum/status"
)

// Example serves the admin listener as main does: it reads the snapshot
// the Server serves, reload's history and the listener's counters, and
// hands drains to the cluster.Instance. (Compiled, not run: it serves
// until ctx ends.)
func Example() {
	ctx, log := context.Background(), zerolog.Nop()
	srv := listener.New(log)
	m := reload.New("/etc/fulcrum/fulcrum.toml", srv, log, reload.Options{})
	inst := cluster.New(func() *sched.Table {
		if s := srv.Snapshot(); s != nil {
			return s.Table
		}
		return nil
	}, log)
	src := admin.Source{Source: status.Source{Snapshot: srv.Snapshot, Reloads: m.Status, Sockets: srv.Sockets, Instance: inst},
		Set: m.SetOverride, Promote: m.Promote}
	ln, err := net.Listen("tcp", "127.0.0.1:9900")
	if err != nil {
		return
	}
	_ = admin.Serve(ctx, ln, admin.Handler(src), admin.Options{Log: log}) // returns when ctx ends
}
