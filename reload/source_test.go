package reload

import (
	"net/netip"
	"slices"
	"testing"
)

// TestProbeAddrs: the self-test of source = "client" probes from the
// highest host address of each allow prefix of the backend's family that
// is not this host's (an IPv4 subnet's broadcast address skipped), or from
// the documentation address when no prefix fits.
func TestProbeAddrs(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	local := map[netip.Addr]bool{netip.MustParseAddr("10.0.9.254"): true}
	v4, v6 := netip.MustParseAddr("10.0.2.11"), netip.MustParseAddr("fd00::11")
	for _, c := range []struct {
		name  string
		allow []netip.Prefix
		to    netip.Addr
		want  []string
	}{
		{"no allow", nil, v4, []string{"192.0.2.1"}},
		{"no allow, IPv6", nil, v6, []string{"2001:db8::1"}},
		{"a /24 and a /32", pfx("10.0.1.0/24", "10.0.7.9/32"), v4, []string{"10.0.1.254", "10.0.7.9"}},
		{"this host's address skipped", pfx("10.0.9.0/24"), v4, []string{"10.0.9.253"}},
		{"a /31", pfx("10.0.5.4/31"), v4, []string{"10.0.5.5"}},
		{"other family only", pfx("fd00:1::/64"), v4, []string{"192.0.2.1"}},
		{"IPv6 prefix", pfx("10.0.1.0/24", "fd00:1::/64"), v6, []string{"fd00:1::ffff:ffff:ffff:ffff"}},
	} {
		var got []string
		for _, p := range probeAddrs(c.allow, c.to, local) {
			got = append(got, p.from.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: probeAddrs(%v, %s) = %v; want %v", c.name, c.allow, c.to, got, c.want)
		}
	}
}
