package systemd

import "golang.org/x/sys/unix"

// sockCloexec opens the notify socket close-on-exec, atomically, so that a
// binary upgrade's child never inherits it.
const sockCloexec = unix.SOCK_CLOEXEC
