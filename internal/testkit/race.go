//go:build race

package testkit

// RaceEnabled: the tests run under the race detector, which slows them
// several times over; a tight timing bound may scale with it.
const RaceEnabled = true
