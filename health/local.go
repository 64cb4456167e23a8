package health

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// LocalError reports whether a dial (a connection's or a check's) failed
// for want of one of fulcrum's own resources, which says nothing about the
// backend: descriptors (EMFILE, ENFILE), kernel memory (ENOBUFS, ENOMEM),
// local ports (EADDRNOTAVAIL), or a socket that could not be made at all.
// Neither passive nor active checks hold such a failure against a backend.
func LocalError(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.EADDRNOTAVAIL} {
		if errors.Is(err, e) {
			return true
		}
	}
	var se *os.SyscallError
	return errors.As(err, &se) && se.Syscall == "socket"
}
