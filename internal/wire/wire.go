// Package wire reads what a client says first, as bytes only: the TLS
// ClientHello's server name and protocols, PostgreSQL's SSLRequest and
// CancelRequest, and the PROXY header (v1 and v2) of a balancer in front.
// It never touches a socket: listener peeks at the client's descriptor and
// hands the bytes here, to be told whether they are whole, how long the
// message is, and what it says. Each parser has a fuzz target beside it.
//
// Typical use: Example, in example_test.go; listener/hello.go and
// listener/proxyproto.go are the callers.
package wire
