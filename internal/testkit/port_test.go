package testkit

import (
	"net"
	"strconv"
	"testing"
)

// TestReservePort: a port handed out is held until its test ends, against
// another draw of this process or another's (an flock is per open file,
// so a second open here stands for another process), and a port another
// socket listens on is never handed out.
func TestReservePort(t *testing.T) {
	dir := t.TempDir()
	defer func(d string) { portDir = d }(portDir)
	portDir = dir // a port another test binary holds cannot make this fail
	release := reservePort(dir, 20001)
	if release == nil {
		t.Fatal("reservePort: a fresh port was refused")
	}
	if again := reservePort(dir, 20001); again != nil {
		again()
		t.Fatal("reservePort handed out a port already held")
	}
	release()
	again := reservePort(dir, 20001)
	if again == nil {
		t.Fatal("reservePort: a released port stays held")
	}
	again()

	var p int
	t.Run("held", func(t *testing.T) {
		p = freePortOn(t, "127.0.0.1", "127.0.33.7")
		for _, h := range []string{"127.0.0.1", "127.0.33.7"} {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("freePortOn returned %d, not free on %s: %v", p, h, err)
			}
			ln.Close()
		}
		if r := reservePort(dir, p); r != nil {
			r()
			t.Fatalf("port %d is not held while its test runs", p)
		}
	})
	r := reservePort(dir, p)
	if r == nil {
		t.Fatalf("port %d still held after its test ended", p)
	}
	r()
}
