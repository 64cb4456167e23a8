package conf

import (
	"fmt"
	"net/netip"
	"strings"
)

// Source is a service's source key: the address its connections to the
// backends come from. The zero Source is fulcrum's own address, as the
// kernel chooses it (the default).
type Source struct {
	// Client is source = "client": each connection to a backend is bound to
	// the client's own address (the PROXY header's when it is trusted),
	// with Linux's IP_TRANSPARENT, so that the backend sees the client
	// (pg_hba.conf rules by subnet, inet_client_addr()). It needs
	// CAP_NET_ADMIN and a route that brings the backend's replies back to
	// fulcrum; the daemon proves that route at start and at each reload
	// (docs/databases.md). Checks still come from fulcrum's own address.
	Client bool
	// Addrs is source = ["ADDR", …], a pool of egress addresses: parsed
	// and validated, then refused as not yet supported (a later change
	// spreads connections over them). nil: not this form.
	Addrs []netip.Addr
	// Line is the key's line in the file (0: not written), so that the
	// daemon's self-test of Client locates its refusal as conf's errors are.
	Line int
}

// SourceClient is the string form of source.
const SourceClient = "client"

// source reads a service's source key: "client", or an array of addresses.
func (w *walker) source(t *table) Source {
	v, ok := t.get("source")
	if !ok {
		return Source{}
	}
	key := t.key("source")
	switch v := v.(type) {
	case string:
		if v == SourceClient {
			return Source{Client: true}
		}
		w.errorf(key, `%q is neither "client" (connect from the client's own address) nor an array of egress addresses`, v)
	case []any:
		var s Source
		for i, e := range v {
			str, ok := e.(string)
			a, err := netip.ParseAddr(str)
			switch {
			case !ok:
				w.errorf(fmt.Sprintf("%s[%d]", key, i), "want an address string, have %s", typeName(e))
			case err != nil || a.Zone() != "" || a.IsUnspecified():
				w.errorf(fmt.Sprintf("%s[%d]", key, i), "%q is not an IP address of this host, such as \"10.0.0.5\"", str)
			default:
				s.Addrs = append(s.Addrs, a.Unmap())
			}
		}
		if len(v) == 0 {
			w.errorf(key, `an empty array: write "client", or leave source out for fulcrum's own address`)
		} else if len(s.Addrs) == len(v) {
			addrs := make([]string, len(s.Addrs))
			for i, a := range s.Addrs {
				addrs[i] = a.String()
			}
			w.errorf(key, `a pool of egress addresses [%s] is not yet supported; source = "client" is`, strings.Join(addrs, ", "))
		}
	default:
		w.errorf(key, `want "client" or an array of addresses, have %s`, typeName(v))
	}
	return Source{}
}

// sourceLines sets the line of each service's source key that is set,
// from the file's text: only then is the text scanned.
func sourceLines(cfg *Config, src []byte) {
	var pos map[string]int
	for i := range cfg.Services {
		s := &cfg.Services[i]
		if !s.Source.Client {
			continue
		}
		if pos == nil {
			pos = locate(string(src))
		}
		s.Source.Line = line(pos, "services."+s.Name+".source")
	}
}
