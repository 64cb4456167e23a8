package statefile_test

import (
	"context"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/listener"
	"fulcrum/reload"
	"fulcrum/statefile"
)

// Example keeps [admin] state_file as main and reload do: main opens it
// before anything serves, and reload restores it at its first commit
// (File.Restore), marks it at every commit and change (File.Changed) and
// runs its writer (File.Run) for as long as its own Run. (Compiled, not
// run.)
func Example() {
	ctx, log := context.Background(), zerolog.Nop()
	cfg, err := conf.Load("/etc/fulcrum/fulcrum.toml")
	if err != nil {
		return
	}
	f, err := statefile.Open(cfg.Admin.StateFile, cfg.Admin.StateDamaged == conf.StateDamageStartEmpty, log)
	if err != nil {
		return // Open logged why: a damaged file under state_damaged = "refuse"
	}
	srv := listener.New(log)
	m := reload.New(cfg.File, srv, log, reload.Options{State: f})
	_ = m.Run(ctx, cfg)
}
