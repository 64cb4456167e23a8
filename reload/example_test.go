package reload_test

import (
	"context"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/reload"
)

// Example runs the daemon's reload loop as main does: the Server holds the
// snapshot, the Manager is its one publisher. (Compiled, not run: it
// serves until ctx ends.)
func Example() {
	ctx, log := context.Background(), zerolog.Nop()
	path := "/etc/fulcrum/fulcrum.toml"
	cfg, err := conf.Load(path)
	if err != nil {
		return // print it: every problem, located
	}
	hup := make(chan struct{}, 1) // main sends on it at SIGHUP
	srv := listener.New(log)
	m := reload.New(path, srv, log, reload.Options{Hup: hup}) // SIGHUP reloads at once
	_ = m.Run(ctx, cfg)                                       // applies cfg, follows the file until ctx ends, then shuts down
}
