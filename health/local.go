package health

import "fulcrum/internal/sockfd"

// LocalError reports whether a dial (a connection's or a check's) failed
// for want of one of fulcrum's own resources, which says nothing about the
// backend (sockfd.LocalError, the one list of them: descriptors, kernel
// memory, local ports, a socket not made). Neither passive nor active
// checks hold such a failure against a backend.
func LocalError(err error) bool { return sockfd.LocalError(err) }
