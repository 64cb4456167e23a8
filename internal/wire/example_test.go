package wire_test

import (
	"fmt"
	"net/netip"
	"strings"

	"fulcrum/internal/wire"
)

// Example frames and parses a PROXY header at the start of what a
// balancer sent, as listener's readHeader does with the bytes it peeked:
// HeaderLen says how many bytes to consume, ParseHeader and Addrs what they
// say.
func Example() {
	var b strings.Builder
	wire.WriteHeader(&b, 1, netip.MustParseAddrPort("192.0.2.1:4242"), netip.MustParseAddrPort("192.0.2.2:5432"))
	peeked := []byte(b.String() + "the client's first bytes")

	n, err := wire.HeaderLen(peeked) // 0: peek for more
	if err != nil || n == 0 {
		return
	}
	h, err := wire.ParseHeader(peeked[:n])
	if err != nil {
		return
	}
	src, dst, _ := wire.Addrs(h)
	fmt.Println(src, dst, string(peeked[n:]))
	// Output: 192.0.2.1:4242 192.0.2.2:5432 the client's first bytes
}
