package backend_test

import (
	"fmt"

	"fulcrum/backend"
)

// session stands for a proxied connection: Drain closes it at its deadline.
type session struct{}

func (session) Close() error { return nil }

// Example is a backend's part in one connection: a slot under its
// max_conns, and the session tracked so that a drain's deadline can close
// it.
func Example() {
	b := backend.New("pg", "a")
	if !b.Acquire(1) {
		return // full or draining: pick another
	}
	fmt.Println("active", b.Active(), "full", !b.Acquire(1)) // a second connection does not fit
	var s session
	b.Track(s) // after the dial
	// ... the session runs ...
	b.Untrack(s)
	b.Release()
	fmt.Println("active", b.Active())
	// Output:
	// active 1 full true
	// active 0
}
