package testkit

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	if err := Until(10*time.Second, func() error {
		if n++; n < 5 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 5 {
		t.Fatalf("Until: err %v after %d calls; want nil after 5", err, n)
	}
	err := Until(20*time.Millisecond, func() error { return errors.New("backend b still up") })
	if err == nil || !strings.Contains(err.Error(), "backend b still up") || !strings.HasPrefix(err.Error(), "after ") {
		t.Fatalf("Until past its deadline: %v; want the last error with the time waited", err)
	}
}
