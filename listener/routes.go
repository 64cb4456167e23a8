package listener

import (
	"errors"
	"net"

	"fulcrum/sched"
)

// Routing by name on a shared listen address: admission calls route after
// the accept (and after a PROXY header), before anything else it does for
// a service, and, for a client that began with an SSLRequest, toBackend
// after the dial and before the splice. See hello.go for the reading and
// sched.Routes for the choice.

// ReasonNoRoute: no route takes the client and the address has no default.
const ReasonNoRoute = "no-route"

// errNoRoute is the detail of a ReasonNoRoute refusal.
var errNoRoute = errors.New("no route for the client's server name and protocols, and no default")

// route reads client c's first message, within the address's
// preread_timeout, and returns the service that takes it with what was
// read. The error is a *PrereadError: the client's message could not be
// read, or (ReasonNoRoute) no route takes it.
func route(c *net.TCPConn, rs *sched.Routes) (*sched.Service, Hello, error) {
	h, err := preread(c, rs.PrereadTimeout())
	if err != nil {
		return nil, h, err
	}
	svc := rs.Match(h.SNI, h.ALPN)
	if svc == nil {
		return nil, h, &PrereadError{Reason: ReasonNoRoute, Err: errNoRoute}
	}
	return svc, h, nil
}

// toBackend prepares backend connection bc for the client's bytes: for a
// client whose SSLRequest fulcrum answered, the backend must accept one
// too (a *PrereadError with ReasonNoSSL otherwise, to be treated as a
// failed connect); for others there is nothing to do.
func toBackend(bc *net.TCPConn, h Hello, svc *sched.Service) error {
	if h.Proto != ProtoPostgres {
		return nil
	}
	return backendSSL(bc, svc.ConnectTimeout)
}
