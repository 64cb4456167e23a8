package conf

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strings"

	"github.com/BurntSushi/toml"
)

// AdminListen reads only [admin] listen from the file at path, leniently:
// for the commands that ask a running daemon (fulcrum status, set, drain,
// healthz, upgrade), which must work while someone is half-way through
// editing the file, since the daemon keeps running its last good table. It
// decodes the TOML without validating it; if even that fails, it looks for
// the key line by line. It returns the zero AddrPort (and no error) when
// the file sets none.
func AdminListen(path string) (netip.AddrPort, error) {
	data, err := Read(path)
	if err != nil {
		return netip.AddrPort{}, err
	}
	var raw struct {
		Admin struct {
			Listen any `toml:"listen"`
		} `toml:"admin"`
	}
	var s string
	if _, err := toml.Decode(string(data), &raw); err == nil {
		if raw.Admin.Listen == nil {
			return netip.AddrPort{}, nil
		}
		v, ok := raw.Admin.Listen.(string)
		if !ok {
			return netip.AddrPort{}, fmt.Errorf("admin.listen: want a string such as \"127.0.0.1:9900\", have %v", raw.Admin.Listen)
		}
		s = v
	} else if s, err = scanAdminListen(data); err != nil || s == "" {
		return netip.AddrPort{}, err
	}
	ap, err := parseListen(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("admin.listen: %v", err)
	}
	return ap, nil
}

// scanAdminListen finds listen = "…" under a [admin] header in a file the
// TOML decoder refused, the way a person would: line by line.
func scanAdminListen(data []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	in := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			in = strings.TrimSpace(strings.Trim(line, "[]")) == "admin"
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !in || !ok || strings.TrimSpace(k) != "listen" {
			continue
		}
		v = strings.TrimSpace(v)
		if i := strings.Index(v, "#"); i >= 0 && strings.Count(v[:i], `"`)%2 == 0 {
			v = strings.TrimSpace(v[:i])
		}
		if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
			return "", fmt.Errorf("admin.listen: cannot read %s", v)
		}
		return v[1 : len(v)-1], nil
	}
	return "", sc.Err()
}
