package testkit

import (
	"fmt"
	"testing"
	"time"
)

// WaitFor calls f until it returns nil, and fails the test with f's last
// error if d passes first. It polls from 1 ms, doubling to 50 ms, so a fast
// condition is seen at once and a slow one costs little; a condition that
// has an event to wait on (a log line, a channel) should wait on that
// instead. It must be called from the test's goroutine (it calls
// t.Fatalf); Until is the same for any goroutine.
func WaitFor(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	if err := Until(d, f); err != nil {
		t.Fatal(err)
	}
}

// Until calls f until it returns nil, and returns f's last error, with how
// long it waited, if d passes first.
func Until(d time.Duration, f func() error) error {
	start := time.Now()
	deadline := start.Add(d)
	pause := time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(pause) // polling: the condition has no event to wait on
		if pause *= 2; pause > 50*time.Millisecond {
			pause = 50 * time.Millisecond
		}
	}
}
