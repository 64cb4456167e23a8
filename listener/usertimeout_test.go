package listener

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func getUserTimeout(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// TestUserTimeout: user_timeout reaches both legs: the accepted socket
// through setUserTimeout, the dialled one through the Dialer's Control,
// before the connect.
func TestUserTimeout(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Control: userTimeout(1500 * time.Millisecond)}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := getUserTimeout(t, c.(*net.TCPConn)); got != 1500 {
		t.Errorf("dialled socket: TCP_USER_TIMEOUT = %d ms; want 1500", got)
	}
	a, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := setUserTimeout(a, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := getUserTimeout(t, a); got != 30000 {
		t.Errorf("accepted socket: TCP_USER_TIMEOUT = %d ms; want 30000", got)
	}
	if userTimeout(0) != nil || setUserTimeout(a, 0) != nil {
		t.Error("user_timeout 0 is not a no-op")
	}
}

// setUserTimeout sets TCP_USER_TIMEOUT on c, as the dial does on a raw socket; d <= 0 leaves the kernel's
// default.
func setUserTimeout(c *net.TCPConn, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return userTimeout(d)("", "", rc)
}
