package listener

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestConnLimit(t *testing.T) {
	for _, c := range []struct{ nofile, want int }{{20000, 9000}, {1024, 448}, {300, 86}, {100, 1}} {
		if got := connLimit(c.nofile); got != c.want {
			t.Errorf("connLimit(%d) = %d; want %d", c.nofile, got, c.want)
		}
	}
}

// TestLocalError: a dial that failed for want of fulcrum's own resources
// is told apart from one the backend refused.
func TestLocalError(t *testing.T) {
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, c := range []struct {
		err   error
		local bool
	}{
		{dial(os.NewSyscallError("socket", unix.EMFILE)), true},
		{dial(os.NewSyscallError("connect", unix.EADDRNOTAVAIL)), true},
		{dial(os.NewSyscallError("socket", unix.EAFNOSUPPORT)), true},
		{dial(os.NewSyscallError("connect", unix.ENOBUFS)), true},
		{dial(os.NewSyscallError("connect", unix.ECONNREFUSED)), false},
		{dial(os.NewSyscallError("connect", unix.EHOSTUNREACH)), false},
		{dial(os.ErrDeadlineExceeded), false},
	} {
		if got := localError(c.err); got != c.local {
			t.Errorf("localError(%v) = %v; want %v", c.err, got, c.local)
		}
	}
}
