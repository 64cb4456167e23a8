// Package wire reads what a client says first, as bytes only: the TLS
// ClientHello's server name and protocols, PostgreSQL's SSLRequest and
// CancelRequest, and the PROXY header (v1 and v2) of a balancer in front.
// It never touches a socket: listener peeks at the client's descriptor and
// hands the bytes here, to be told whether they are whole, how long the
// message is, and what it says. Each parser has a fuzz target beside it.
//
// Typical use (listener/hello.go, listener/proxyproto.go):
//
//	n, err := wire.HelloLen(peeked) // 0: peek for more
//	h, err := wire.ParseHello(peeked[:n])
//	_ = h.SNI                    // route by it
//
//	n, err = wire.HeaderLen(peeked) // a PROXY header: 0 while more is needed
//	hdr, err := wire.ParseHeader(peeked[:n])
//	src, dst, ok := wire.Addrs(hdr)
package wire
