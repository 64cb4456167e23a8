package sched

import (
	"strings"
	"testing"
)

func svcNamed(name string) *Service { return &Service{Name: name} }

func TestRoutesMatch(t *testing.T) {
	db1, db2, tenants, web, pg17, def := svcNamed("db1"), svcNamed("db2"), svcNamed("tenants"), svcNamed("web"), svcNamed("pg17"), svcNamed("default")
	db1h2, db1any := svcNamed("db1h2"), svcNamed("db1any")
	rs, err := NewRoutes([]Route{
		{Service: db1, Names: []string{"db1.example.com"}},
		{Service: db2, Names: []string{"DB2.example.com", "db2.internal"}},
		{Service: tenants, Names: []string{"*.tenants.example.com"}},
		{Service: web, Names: []string{"app.example.com"}, ALPN: []string{"h2", "http/1.1"}},
		{Service: pg17, Names: []string{"app.example.com"}, ALPN: []string{"postgresql"}},
		{Service: def, Names: []string{"*"}},
		{Service: db1h2, Names: []string{"db1h2.example.com"}, ALPN: []string{"h2"}},
		{Service: db1any, Names: []string{"db1h2.example.com"}}, // a name shared by a route with ALPN and one without
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sni  string
		alpn []string
		want *Service
	}{
		{"db1.example.com", nil, db1},
		{"DB1.Example.COM", nil, db1},
		{"db1.example.com.", nil, db1},
		{"db2.example.com", nil, db2},
		{"db2.internal", []string{"postgresql"}, db2},
		{"a.tenants.example.com", nil, tenants},
		{"xn--bcher-kva.tenants.example.com", nil, tenants},
		{"tenants.example.com", nil, def},
		{"a.b.tenants.example.com", nil, def},
		{"app.example.com", []string{"h2"}, web},
		{"app.example.com", []string{"postgresql"}, pg17},
		{"app.example.com", []string{"postgresql", "h2"}, pg17}, // the client's preference
		{"app.example.com", []string{"h2", "postgresql"}, web},
		{"app.example.com", []string{"imap"}, def},
		{"app.example.com", nil, def},
		{"unknown.example.com", nil, def},
		{"", nil, def},
		{"", []string{"h2"}, def},
		{"db1h2.example.com", []string{"h2"}, db1h2},
		{"db1h2.example.com", []string{"http/1.1", "h2"}, db1h2},
		{"db1h2.example.com", []string{"http/1.1"}, db1any},
		{"db1h2.example.com", nil, db1any},
	} {
		if got := rs.Match(tc.sni, tc.alpn); got != tc.want {
			t.Errorf("Match(%q, %q) = %v; want %v", tc.sni, tc.alpn, name(got), name(tc.want))
		}
	}
	if rs.Default() != def {
		t.Errorf("Default() = %v; want default", name(rs.Default()))
	}

	// Without a default, an unmatched client has no route.
	rs, err = NewRoutes([]Route{{Service: db1, Names: []string{"db1.example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, sni := range []string{"", "db2.example.com", "example.com"} {
		if got := rs.Match(sni, nil); got != nil {
			t.Errorf("Match(%q) = %v; want nil", sni, name(got))
		}
	}
}

func name(s *Service) string {
	if s == nil {
		return "<nil>"
	}
	return s.Name
}

func TestRoutesInvalid(t *testing.T) {
	a, b := svcNamed("a"), svcNamed("b")
	for _, tc := range []struct {
		name   string
		routes []Route
		want   string
	}{
		{"same name", []Route{{Service: a, Names: []string{"x.example.com"}}, {Service: b, Names: []string{"X.example.com"}}},
			`services "a" and "b" both claim name "x.example.com"`},
		{"same wildcard", []Route{{Service: a, Names: []string{"*.example.com"}}, {Service: b, Names: []string{"*.example.com"}}},
			`services "a" and "b" both claim name "*.example.com"`},
		{"same name and protocol", []Route{{Service: a, Names: []string{"x.example.com"}, ALPN: []string{"h2"}}, {Service: b, Names: []string{"x.example.com"}, ALPN: []string{"http/1.1", "h2"}}},
			`both claim name "x.example.com" with ALPN "h2"`},
		{"same name, neither with ALPN", []Route{{Service: a, Names: []string{"x.example.com"}}, {Service: b, Names: []string{"x.example.com"}, ALPN: nil}},
			`services "a" and "b" both claim name "x.example.com"`},
		{"two defaults", []Route{{Service: a, Names: []string{"*"}}, {Service: b, Names: []string{"*"}}},
			`services "a" and "b" are both the default`},
		{"plain service", []Route{{Service: a, Names: []string{"x.example.com"}}, {Service: b}},
			`service "b" shares the address with routed services but names no sni`},
		{"default with alpn", []Route{{Service: a, Names: []string{"*"}, ALPN: []string{"h2"}}},
			`cannot require alpn`},
		{"inner wildcard", []Route{{Service: a, Names: []string{"a.*.example.com"}}}, `whole first label`},
		{"partial wildcard", []Route{{Service: a, Names: []string{"db*.example.com"}}}, `whole first label`},
		{"unicode", []Route{{Service: a, Names: []string{"bücher.example.com"}}}, `xn-- form`},
		{"empty label", []Route{{Service: a, Names: []string{"a..example.com"}}}, `1 to 63 bytes`},
		{"space", []Route{{Service: a, Names: []string{"a b.example.com"}}}, `not a letter`},
		{"empty alpn", []Route{{Service: a, Names: []string{"a.example.com"}, ALPN: []string{""}}}, `not 1 to 255 bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRoutes(tc.routes)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRoutes = %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckName(t *testing.T) {
	for _, n := range []string{"*", "db1.example.com", "*.tenants.example.com", "localhost", "xn--bcher-kva.example", "_srv.example.com", "A.EXAMPLE.COM"} {
		if err := CheckName(n); err != nil {
			t.Errorf("CheckName(%q) = %v; want nil", n, err)
		}
	}
	for _, n := range []string{"", "*.", "**", "*.*.example.com", "example.com.", strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 127) + "com"} {
		if err := CheckName(n); err == nil {
			t.Errorf("CheckName(%q) = nil; want an error", n)
		}
	}
}

func BenchmarkRoutesMatch(b *testing.B) {
	rs, err := NewRoutes([]Route{
		{Service: svcNamed("db1"), Names: []string{"db1.example.com"}},
		{Service: svcNamed("tenants"), Names: []string{"*.tenants.example.com"}},
		{Service: svcNamed("default"), Names: []string{"*"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if rs.Match("a.tenants.example.com", nil) == nil {
			b.Fatal("no match")
		}
	}
}
