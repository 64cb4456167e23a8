package conf

import "fulcrum/health"

// The keys whose value is one of a few words are read once, at load, into
// these types; the code that acts on them compares constants, never
// strings.

// OnDown is on_down: what a backend's established sessions get when it
// goes down or into the wrong role.
type OnDown string

const (
	OnDownKeep  OnDown = "keep"  // they run on (the default)
	OnDownClose OnDown = "close" // they are ended
)

// OnUp is on_up: what the sessions on backups get when a primary backend
// comes up.
type OnUp string

const (
	OnUpKeep         OnUp = "keep"          // they run on (the default)
	OnUpCloseBackups OnUp = "close-backups" // they are ended
)

// OnRoleChange is on_role_change: what a backend's sessions get when its
// checks see it change role (promoted, demoted).
type OnRoleChange string

const (
	OnRoleChangeClose OnRoleChange = "close" // they are ended (the default)
	OnRoleChangeKeep  OnRoleChange = "keep"  // they run on
)

// SplitBrain is split_brain: what a service whose checks want role
// "primary" does while more than one backend claims it.
type SplitBrain string

const (
	SplitBrainRefuse SplitBrain = "refuse" // no new connection goes to any claimant (the default)
	SplitBrainFirst  SplitBrain = "first"  // the first claimant in file order takes them
	SplitBrainNewest SplitBrain = "newest" // the claimant on the newest timeline takes them (pgsql)
)

// Failback is a scheduler = "first" service's failback, without its
// duration (Service.FailbackAfter).
type Failback string

const (
	FailbackNone   Failback = ""       // back to the first backend as soon as it is up (the default)
	FailbackNever  Failback = "never"  // stay on the writer until it fails
	FailbackManual Failback = "manual" // stay until an operator promotes a backend
	FailbackAfter  Failback = "after"  // back once the preferred backend has been up for FailbackAfter
)

// Protocol is a service's protocol: what it speaks, for what the listener
// looks for (PostgreSQL cancel requests).
type Protocol string

const (
	ProtocolAuto     Protocol = "auto"     // postgres when a backend checks with pgsql, else tcp (the default)
	ProtocolPostgres Protocol = "postgres" // PostgreSQL
	ProtocolTCP      Protocol = "tcp"      // anything else
)

// StateDamage is [admin] state_damaged: what a start does with a state
// file it cannot read.
type StateDamage string

const (
	StateDamageRefuse     StateDamage = "refuse"      // do not start (the default)
	StateDamageStartEmpty StateDamage = "start-empty" // move it aside and start without it
)

// LogFormat is [log] format.
type LogFormat string

const (
	LogAuto    LogFormat = "auto"    // console on a terminal, else JSON (the default)
	LogJSON    LogFormat = "json"    // one JSON object a line
	LogConsole LogFormat = "console" // zerolog's human-readable lines
)

// The values of [health] role: the role a check requires of a backend.
// They are the roles checks observe (backend.RolePrimary, …), so they stay
// plain strings.
const (
	RoleAny     = "any"
	RolePrimary = "primary"
	RoleReplica = "replica"
	RoleGalera  = health.RoleGalera
)

// enum reads k as one of choices, or def when it is not set.
func enum[T ~string](t *table, k string, def T, choices []T) T {
	ss := make([]string, len(choices))
	for i, c := range choices {
		ss[i] = string(c)
	}
	return T(t.oneOf(k, string(def), ss...))
}
