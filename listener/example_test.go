package listener_test

import (
	"net/netip"

	"github.com/rs/zerolog"

	"fulcrum/listener"
	"fulcrum/sched"
)

// Example is what reload does with a Server at each configuration: bind
// what is new, publish the snapshot that names it, then start accepting
// there. (Compiled, not run.)
func Example() {
	srv := listener.New(zerolog.Nop())
	ch, err := srv.Prepare([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:7000")}, false) // binds; nothing accepts yet
	if err != nil {
		return // Prepare closed what it had bound
	}
	var next *sched.Table                        // reload builds it from the configuration
	srv.Publish(listener.NewSnapshot(next, nil)) // new connections read it; held ones are woken
	ch.Commit()                                  // start the new accept loops, close the removed ones
	_ = srv.Snapshot()                           // what admin, status and health read
	srv.Close()                                  // stop accepting everywhere
	srv.Wait()                                   // accept loops and sessions have ended
}
