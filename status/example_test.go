package status_test

import (
	"fmt"
	"net/netip"

	"fulcrum/backend"
	"fulcrum/listener"
	"fulcrum/sched"
	"fulcrum/status"
)

// Example reads a status from the snapshot a Server serves, as the admin
// listener and reload's STATUS= line do (main passes srv.Snapshot, and
// m.Status and m.Draining of the reload.Manager).
func Example() {
	a, b := backend.New("pg", "a"), backend.New("pg", "b")
	b.StopNew() // draining
	ts := []sched.Target{
		{B: a, Addr: netip.MustParseAddrPort("127.0.0.1:5432"), Weight: 1, Base: 1},
		{B: b, Addr: netip.MustParseAddrPort("127.0.0.1:5433"), Weight: 1, Base: 1},
	}
	p, err := sched.New("rr", ts, nil, sched.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	snap := listener.NewSnapshot(sched.NewTable(3, []*sched.Service{{Name: "pg", Scheduler: "rr", Targets: ts, Picker: p}}, nil), nil)

	st := status.Of(status.Source{Snapshot: func() *listener.Snapshot { return snap }})
	fmt.Println(st.Line())
	for _, be := range st.Services[0].Backends {
		fmt.Println(be.Name, be.State)
	}
	// Output:
	// generation 3; 1 services; backends 1/2 up; 0 connections
	// a up
	// b draining
}
