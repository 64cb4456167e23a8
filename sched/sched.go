// Package sched holds the immutable snapshot that the connection path reads
// (Table, Service, Target) and the schedulers that pick a backend for each new
// connection.
//
// A scheduler is built from an immutable []Target and lives inside the
// snapshot that reload swaps atomically. Pick is safe for concurrent use,
// allocates nothing, takes no lock shared with reload and never blocks. Its
// only mutable state is its own cursor (an atomic), documented per scheduler
// together with what a rebuild does to it.
//
// Typical use, per connection:
//
//	var r sched.Request
//	r.Client = clientAddr
//	i, err := svc.Picker.Pick(&r) // err is ErrNoBackend when nothing is eligible
//	r.MarkTried(i)                // a retry never picks i again
//	t := &svc.Targets[i]
//
// The package does no I/O and no logging.
package sched

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"fulcrum/backend"
)

// ErrNoBackend means no backend is eligible: none configured, all weights 0,
// or every one down, full, draining or already tried.
var ErrNoBackend = errors.New("no backend available")

// Target is one backend as a snapshot sees it: the live object plus the
// settings of this generation.
type Target struct {
	B      *backend.Backend
	Addr   netip.AddrPort // where to dial
	Weight int            // 0 = no new connections
}

// MaxTries bounds how many backends one connection may try.
const MaxTries = 16

// Request carries what a scheduler may look at for one connection: the client
// address (for hashing) and the backends already tried. The zero value plus
// Client is ready to use.
type Request struct {
	Client netip.AddrPort
	n      int
	tried  [MaxTries]int32
}

// MarkTried excludes target i from later picks for this request. It reports
// false when the request has tried MaxTries backends already.
func (r *Request) MarkTried(i int) bool {
	if r.n == len(r.tried) {
		return false
	}
	r.tried[r.n] = int32(i)
	r.n++
	return true
}

// Tried reports whether target i was already tried.
func (r *Request) Tried(i int) bool {
	for _, t := range r.tried[:r.n] {
		if int(t) == i {
			return true
		}
	}
	return false
}

// Picker picks a target index for a new connection.
type Picker interface {
	// Pick returns an index into the Targets the picker was built from, or
	// ErrNoBackend. It never returns a target with weight 0, one whose
	// backend is draining, or one r has tried.
	Pick(r *Request) (int, error)
}

// eligible is the rule every scheduler applies before picking target i.
func eligible(ts []Target, i int, r *Request) bool {
	t := &ts[i]
	return t.Weight > 0 && !r.Tried(i) && !t.B.Draining()
}

// New builds the scheduler called name over targets. prev is the picker of
// the same service in the previous snapshot, or nil; a scheduler of the same
// kind may carry its cursor over from it (see each type).
func New(name string, targets []Target, prev Picker) (Picker, error) {
	switch name {
	case "rr":
		return NewRoundRobin(targets, prev), nil
	case "wrr":
		return NewWeightedRoundRobin(targets, prev), nil
	case "lc":
		return NewLeastConn(targets), nil
	}
	return nil, fmt.Errorf("unknown scheduler %q", name)
}

// Names lists the schedulers New knows.
var Names = []string{"rr", "wrr", "lc"}

// Service is one service in a snapshot: its backends, scheduler and settings.
type Service struct {
	Name           string
	Scheduler      string // the scheduler's config name
	Targets        []Target
	Picker         Picker
	ConnectTimeout time.Duration // per dial attempt
	IdleTimeout    time.Duration // 0 = none
	Retries        int           // further backends tried after a failed connect
	DrainTimeout   time.Duration // a removed backend's sessions are closed after this; 0 = never
	AccessLog      bool          // one log line per finished connection
	Parked         bool          // connections hold no goroutine while idle (copy = "parked")
}

// Table is one immutable snapshot of the whole configuration. The reload
// path builds a new Table and swaps it in; the connection path loads the
// current one once per connection.
type Table struct {
	Gen      uint64     // 1 for the first configuration, +1 per applied reload
	Services []*Service // in config order

	listen map[netip.AddrPort]*Service
}

// NewTable returns a table routing each listen address to its service.
func NewTable(gen uint64, services []*Service, listen map[netip.AddrPort]*Service) *Table {
	return &Table{Gen: gen, Services: services, listen: listen}
}

// Route returns the service that owns listen address a (as configured), or
// nil if no service does in this generation.
func (t *Table) Route(a netip.AddrPort) *Service {
	return t.listen[a]
}

// Service returns the service called name, or nil.
func (t *Table) Service(name string) *Service {
	for _, s := range t.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}
