//go:build !race

package reload

const raceEnabled = false
