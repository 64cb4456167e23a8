package systemd

import (
	"os"
	"strings"
	"testing"
)

// TestTransparentDropIn: source = "client"'s CAP_NET_ADMIN is granted only
// by the opt-in drop-in, which adds it to both the ambient and the bounding
// set (a bounding set without it would drop the ambient one); the main unit
// never grants it.
func TestTransparentDropIn(t *testing.T) {
	unit, err := os.ReadFile("fulcrum.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(unit), "\n") {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, "CAP_NET_ADMIN") {
			t.Errorf("fulcrum.service grants CAP_NET_ADMIN (%q); only transparent.conf may", l)
		}
	}
	drop, err := os.ReadFile("transparent.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[Service]", "AmbientCapabilities=CAP_NET_ADMIN", "CapabilityBoundingSet=CAP_NET_ADMIN"} {
		if !strings.Contains(string(drop), "\n"+want+"\n") {
			t.Errorf("transparent.conf lacks the line %q", want)
		}
	}
}
