// Package sched holds the immutable scheduling table that the connection
// path reads (Table, Service, Target; what reload publishes is a
// listener.Snapshot, which pairs a Table with each service's policy) and
// the schedulers that pick a backend for each new connection: rr, wrr, swrr, random, wrandom, lc, wlc, sed, nq, p2c, sh, mh
// and first (see Names and New; each type names the reference it follows).
//
// A scheduler is built from an immutable []Target and lives inside the
// Table of the snapshot that reload swaps atomically. Pick is safe for concurrent use,
// allocates nothing, takes no lock shared with reload and never blocks. Its
// only mutable state is its own cursor (an atomic; swrr's state-machine form
// has a mutex of its own), documented per scheduler together with what a
// rebuild does to it:
//
//   - rr continues after the backend it picked last (LVS keeps its position);
//   - wrr restarts its cycle (LVS init_svc);
//   - swrr carries the current weights of the backends it keeps, matched by
//     *backend.Backend (nginx resets them on reload);
//   - the others have no cursor: lc, wlc, sed, nq and p2c read live counts,
//     random and wrandom draw, sh and mh are functions of the client and
//     the configuration, first takes the first eligible target in order.
//
// reload reuses a service's picker, cursor included, when its targets and
// options are unchanged.
//
// Shared rules. Weight 0 excludes a target from new picks (drain). No
// targets, or total weight 0, gives ErrNoBackend. One eligible target is
// returned without drawing. A backend that is full (Target.MaxConns) or
// draining or down (health checks, passive failures, no address, the wrong
// role), or already tried by this connection, is skipped at pick time by
// the one function eligible(), which reads atomics only, so nothing is
// rebuilt per connection: sequence schedulers pass over its slot,
// random ones draw again, the lc family and p2c leave it out, and the
// hashing ones fall back to other slots deterministically. Every fast path
// is bounded and ends in an exact scan, so a connection is refused only
// when no target is eligible.
//
// Typical use, per connection (Example runs it):
//
//	var r sched.Request
//	r.Client = clientAddr
//	i, err := svc.Picker.Pick(&r) // err is ErrNoBackend when nothing is eligible
//	r.MarkTried(i)                // a retry never picks i again
//	t := &svc.Targets[i]
//	if !t.B.Acquire(t.MaxConns) { /* full or draining since the pick: pick again */ }
//
// The package does no I/O and no logging.
package sched

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"fulcrum/backend"
)

// ErrNoBackend means no backend is eligible: none configured, all weights 0,
// or every one down, full, draining or already tried.
var ErrNoBackend = errors.New("no backend available")

// Target is one backend as a snapshot sees it: the live object plus the
// settings of this generation.
type Target struct {
	B        *backend.Backend
	Addr     netip.AddrPort // where to dial
	Host     string         // host:port as written when the address is a host name (for status views); "" for an IP address
	Weight   int            // effective weight: 0 = no new connections; lower than Base during slow start
	MaxConns int            // connections at once; 0 = unlimited. A full target is skipped, not removed

	Base          int           // the configured weight
	ProxyProtocol int           // PROXY header sent to this backend before any client byte: 0 none, 1 or 2
	MaxFails      int           // passive checks: connect failures within FailTimeout that mark it down; 0 = off
	FailTimeout   time.Duration // passive checks: the window, and how long it stays down
	SlowStart     time.Duration // after it comes up its weight ramps from 10% of Base to Base over this; 0 = at once

	CutOnDown      bool // on_down = "close": its sessions end when it goes down or into the wrong role
	CutOnRole      bool // on_role_change = "close": its sessions end when its checks see it change role
	CutBackupsOnUp bool // on_up = "close-backups": when it (a primary target) comes up, sessions on the backups end
}

// Up reports whether t takes new connections as far as configuration,
// health and drain go: weight above 0 and the backend's own rule
// (backend.Takes: not down, not draining, no operator override). Fullness
// (MaxConns) is not considered: it passes as connections end. Status views
// name the same rule's outcome with backend.Condition.
func (t *Target) Up() bool { return t.Weight > 0 && t.B.Takes() }

// Full reports whether t is at its MaxConns: it takes connections again as
// they end (caddy-l4's full()).
func (t *Target) Full() bool { return t.MaxConns > 0 && t.B.Active() >= int64(t.MaxConns) }

// Available is the whole rule for a new connection: up and not full.
func (t *Target) Available() bool { return t.Up() && !t.Full() }

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
	// backend is draining or down, one at its MaxConns, or one r has tried.
	Pick(r *Request) (int, error)
}

// eligible is the one rule every scheduler applies before picking target i:
// weight > 0, not tried by this request, backend neither draining nor down
// (health checks, passive failures) and, with MaxConns, not full. It reads
// only atomics, so a backend that becomes full, drains or goes down is
// skipped at the next pick without rebuilding anything; the table is then
// rebuilt with a down backend's weight at 0 so that cycles stay fair.
func eligible(ts []Target, i int, r *Request) bool {
	t := &ts[i]
	return t.Available() && !r.Tried(i)
}

// firstEligible is the last resort of schedulers whose fast path gave up
// after a bounded number of ineligible candidates: a scan in list order.
func firstEligible(ts []Target, r *Request) (int, error) {
	for i := range ts {
		if eligible(ts, i, r) {
			return i, nil
		}
	}
	return -1, ErrNoBackend
}

// Defaults of the per-service scheduler options.
const (
	DefaultChoices   = 2     // p2c draws per pick
	DefaultTableSize = 65537 // mh lookup table size (prime)
	MaxTableSize     = 1<<24 - 3
)

// Options are the per-service scheduler parameters. The zero value means
// every default. Options is comparable: reload reuses a picker only when its
// options are unchanged.
type Options struct {
	// Choices is how many backends p2c draws per round; 0 = DefaultChoices.
	Choices int
	// HashKey is what sh and mh hash: "ip" (the client address; "" means
	// "ip") or "ip_port" (address and port: spreads one client's
	// connections, keeps each connection's own mapping).
	HashKey string
	// TableSize is mh's lookup table size: a prime larger than the number
	// of backends, at most MaxTableSize; 0 = DefaultTableSize. Maglev's
	// balance needs it about 100× the number of backends.
	TableSize int
	// Writer is first's sticky writer (failback): the name of the backend
	// that takes every new connection while it is eligible, before the list
	// order applies; "" (default) is the list order alone. reload sets it;
	// the other schedulers ignore it.
	Writer string
	// Source, when set, replaces the runtime's random generator for random,
	// wrandom and p2c, so tests can seed them. A picker with a Source is not
	// safe for concurrent use (rand.Rand has no lock). nil in production.
	Source rand.Source
}

func (o Options) choices() int {
	if o.Choices == 0 {
		return DefaultChoices
	}
	return o.Choices
}

func (o Options) tableSize() int {
	if o.TableSize == 0 {
		return DefaultTableSize
	}
	return o.TableSize
}

// HashKeys lists the values of Options.HashKey ("" means "ip").
var HashKeys = []string{"ip", "ip_port"}

// CheckTableSize says why n cannot be mh's table size, or nil: Maglev's
// permutations cover every slot only when the size is a prime, and no
// larger than MaxTableSize.
func CheckTableSize(n int) error {
	if n < 2 || n > MaxTableSize {
		return fmt.Errorf("%d is not between 2 and %d", n, MaxTableSize)
	}
	if !isPrime(n) {
		return fmt.Errorf("%d is not a prime (65537 and 655373 are)", n)
	}
	return nil
}

// CheckBackends says why a service of n backends cannot use scheduler name
// with options o, or nil: mh needs a table larger than the number of
// backends.
func CheckBackends(name Kind, o Options, n int) error {
	if name == "mh" && o.tableSize() <= n {
		return fmt.Errorf("%d must be larger than the number of backends (%d); about 100 times as large keeps mh balanced", o.tableSize(), n)
	}
	return nil
}

// withPort reports whether the hash key includes the client port.
func (o Options) withPort() (bool, error) {
	switch o.HashKey {
	case "", "ip":
		return false, nil
	case "ip_port":
		return true, nil
	}
	return false, fmt.Errorf("hash key %q is not ip or ip_port", o.HashKey)
}

// New builds the scheduler called name over targets with options o. prev is
// the picker of the same service in the previous snapshot, or nil; a
// scheduler of the same kind may carry its cursor over from it (see each
// type). New fails on an unknown name or an invalid option.
func New(name Kind, targets []Target, prev Picker, o Options) (Picker, error) {
	switch name {
	case "rr":
		return newRoundRobin(targets, prev), nil
	case "wrr":
		return newWeightedRoundRobin(targets, prev), nil
	case "swrr":
		return newSmoothWeightedRoundRobin(targets, prev), nil
	case "random":
		return newRandomSched(targets, o.Source), nil
	case "wrandom":
		return newWeightedRandom(targets, o.Source), nil
	case "lc":
		return newLeastConnSched(targets), nil
	case "wlc":
		return newWeightedLeastConn(targets), nil
	case "sed":
		return newShortestExpectedDelay(targets), nil
	case "nq":
		return newNeverQueue(targets), nil
	case "p2c":
		if c := o.choices(); c < 1 || c > MaxChoices {
			return nil, fmt.Errorf("p2c choices %d is not between 1 and %d", c, MaxChoices)
		}
		return newP2cSched(targets, o.choices(), o.Source), nil
	case "sh":
		wp, err := o.withPort()
		if err != nil {
			return nil, err
		}
		return newSourceHash(targets, wp), nil
	case "mh":
		wp, err := o.withPort()
		if err != nil {
			return nil, err
		}
		return newMaglevSched(targets, o.tableSize(), wp)
	case "first":
		return newFirstSched(targets, o.Writer), nil
	}
	return nil, fmt.Errorf("unknown scheduler %q", name)
}

// Kind names a scheduler: one of Names, as the configuration's scheduler
// key spells it.
type Kind string

// Names lists the schedulers New knows, in the README's order.
var Names = []Kind{"rr", "wrr", "swrr", "random", "wrandom", "lc", "wlc", "sed", "nq", "p2c", "sh", "mh", "first"}

// Service is one service in a snapshot: its backends and how one is picked,
// with the live state of its group. How each of its connections is
// admitted and timed is not here: that is the listener's Policy.
type Service struct {
	Name         string
	Listen       []netip.AddrPort // the addresses it accepts on, as configured
	Scheduler    Kind             // the scheduler's config name
	Options      Options          // the scheduler's parameters
	Targets      []Target         // the primary backends
	Picker       Picker           // over Targets
	Backups      []Target         // backup = true: used only while no primary is up
	BackupPicker Picker           // over Backups; nil when there are none
	DrainTimeout time.Duration    // a removed backend's sessions are closed after this; 0 = never

	// SplitBrain names the backends that claim the primary role at once in
	// a service whose checks want a primary, in file order; nil when at
	// most one does. SplitWriter is the one of them kept as the writer
	// (split_brain = "first": the first; "newest": the one on the highest
	// timeline), which alone keeps its weight; "" while the split refuses
	// ("refuse", or a tie): every target is at weight 0 and new connections
	// are turned away.
	SplitBrain  []string
	SplitWriter string
	// Writer is the backend kept as the writer of a first service with
	// failback (set by reload, which also gives it to the picker as
	// Options.Writer); "" without failback.
	Writer   string
	Fallback *Service // picks from here while none of this service's backends is eligible; nil = none. Same table
}

// All returns the primary and backup targets in one new slice (not for the
// connection path).
func (s *Service) All() []Target {
	return append(s.Targets[:len(s.Targets):len(s.Targets)], s.Backups...)
}

// Pool returns the backends to pick from for a new connection: the primary
// ones, or the backups while no primary is up (HAProxy's backup servers).
// Full primaries do not switch to backups: the connection queues instead.
func (s *Service) Pool() ([]Target, Picker) {
	if s.BackupPicker == nil || anyUp(s.Targets) {
		return s.Targets, s.Picker
	}
	return s.Backups, s.BackupPicker
}

// maxFallbacks bounds a chain of fallbacks that Serving follows (conf
// refuses cycles).
const maxFallbacks = 8

// Serving returns where a new connection to s picks its backend from now:
// from, the service whose pool (see Pool) has a target up, s itself first
// and then along its chain of fallbacks, with that pool's targets and
// picker; while no pool along it has one up, from is nil and the targets
// and picker are s's own (nothing is eligible: the connection is refused
// or held). Fullness does not fall back: a full pool queues instead. The
// listener routes by it and status views name it, so the two agree.
func (s *Service) Serving() (from *Service, ts []Target, p Picker) {
	ts, p = s.Pool()
	if anyUp(ts) {
		return s, ts, p
	}
	for f, n := s.Fallback, 0; f != nil && n < maxFallbacks; f, n = f.Fallback, n+1 {
		if fts, fp := f.Pool(); anyUp(fts) {
			return f, fts, fp
		}
	}
	return nil, ts, p
}

// anyUp reports whether one of ts is up. O(n): a connection's first pick
// and status views.
func anyUp(ts []Target) bool {
	for i := range ts {
		if ts[i].Up() {
			return true
		}
	}
	return false
}

// Condition names t's state (t is one of s's targets) by the one rule of
// whether it takes new connections, Target.Up, which the schedulers,
// /healthz and the status views all ask: backend.Condition of its
// configured weight, or, while that says up and Up does not (this table
// gives it no weight though the file does), draining: by s's split brain,
// which zeroes the weight of every claimant not kept as the writer (of
// every target while it refuses), or because it came up after this table
// was built and the next one gives it its weight.
func (s *Service) Condition(t *Target) backend.Condition {
	c := t.B.Condition(t.Base)
	if c.State != backend.StateUp || t.Up() {
		return c
	}
	if len(s.SplitBrain) > 0 {
		why := "split brain: " + strings.Join(s.SplitBrain, ", ") + " claim primary; "
		if s.SplitWriter != "" {
			why += "only " + s.SplitWriter + " takes new connections"
		} else {
			why += "new connections are refused"
		}
		return backend.Condition{State: backend.StateDraining, Cause: "split brain", Reason: why}
	}
	return backend.Condition{State: backend.StateDraining, Cause: "weight 0", Reason: "up, and given its weight by the next table", Since: c.Since}
}

// Table is the scheduling half of the whole configuration, immutable: its
// services, their backends and pickers, and the routes by name. reload
// builds a new one and publishes it inside a listener.Snapshot, beside
// each service's policy; the connection path loads that snapshot once per
// connection.
type Table struct {
	Gen      uint64     // 1 for the first configuration, +1 per applied reload
	Seq      uint64     // this table's own number, unique: health and DNS rebuilds keep Gen but take a new Seq
	Services []*Service // in config order
	// Routed holds the addresses that route by name (sni), each with its
	// routes, for the builder to set before the table is published. Route
	// gives one of their services, which agree on what comes before the
	// route is chosen (the PROXY header).
	Routed map[netip.AddrPort]*Routes

	listen map[netip.AddrPort]*Service
}

// NewTable returns a table routing each listen address to its service.
// Seq is for the builder to set before the table is published.
func NewTable(gen uint64, services []*Service, listen map[netip.AddrPort]*Service) *Table {
	return &Table{Gen: gen, Services: services, listen: listen}
}

// Route returns the service that owns listen address a (as configured), or
// nil if no service does in this generation.
func (t *Table) Route(a netip.AddrPort) *Service {
	return t.listen[a]
}

// Routes returns the routes of listen address a, or nil when a is not
// routed by name.
func (t *Table) Routes(a netip.AddrPort) *Routes {
	return t.Routed[a]
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
