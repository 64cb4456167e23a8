package handover_test

import (
	"context"
	"net/netip"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/handover"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/statefile"
	"fulcrum/systemd"
)

// Example wires the hand-over as main does: the sockets passed in go to
// the Server, their names to reload, reload's notifications through the
// Upgrader, and the state file stops being written once a new process
// serves. (Compiled, not run: it would serve until ctx ends.)
func Example() {
	ctx, cfg, log := context.Background(), &conf.Config{}, zerolog.Nop()
	state, err := statefile.Open("/var/lib/fulcrum/state.json", false, log)
	if err != nil {
		return
	}
	srv := listener.New(log)
	var sd systemd.Notifier
	up, err := handover.New(srv, &sd, netip.MustParseAddrPort("127.0.0.1:9900"), log, handover.Options{OnServe: state.StopWriting})
	if err != nil {
		return
	}
	adminLn, err := up.ListenAdmin() // serve the admin handler on it; its POST /upgrade calls up.Upgrade
	if err != nil {
		return
	}
	defer adminLn.Close()
	m := reload.New("/etc/fulcrum/fulcrum.toml", srv, log, reload.Options{Notify: up.Notify, Sockets: up.Sockets(), State: state})
	rctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	go func() { // exits at the hand-over or when rctx ends
		select {
		case <-up.Done(): // the new process serves: drain
			adminLn.Close()
			stopServing()
		case <-rctx.Done():
		}
	}()
	_ = m.Run(rctx, cfg)
}
