package sched_test

import (
	"fmt"
	"net/netip"

	"fulcrum/backend"
	"fulcrum/sched"
)

// Example picks backends for one connection as the listener does: a
// backend that fails its dial is marked tried, and the retry never picks
// it again.
func Example() {
	ts := []sched.Target{
		{B: backend.New("pg", "a"), Weight: 1, Base: 1},
		{B: backend.New("pg", "b"), Weight: 1, Base: 1},
	}
	p, err := sched.New("first", ts, nil, sched.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	svc := &sched.Service{Name: "pg", Scheduler: "first", Targets: ts, Picker: p}

	var r sched.Request
	r.Client = netip.MustParseAddrPort("192.0.2.7:40000")
	for {
		i, err := svc.Picker.Pick(&r) // err is ErrNoBackend when nothing is eligible
		if err != nil {
			fmt.Println(err)
			return
		}
		r.MarkTried(i) // a retry never picks i again
		t := &svc.Targets[i]
		if !t.B.Acquire(t.MaxConns) {
			continue // full or draining since the pick: pick again
		}
		fmt.Println("dial", t.B.Name, "— say it fails")
		t.B.Release()
	}
	// Output:
	// dial a — say it fails
	// dial b — say it fails
	// no backend available
}
