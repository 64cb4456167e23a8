package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"fulcrum/listener"
	"fulcrum/sched"
)

// TestRoutedListener: /status shows an address routed by name with its
// routes and its refusals by reason, and /metrics counts the refusals.
func TestRoutedListener(t *testing.T) {
	db1 := &sched.Service{Name: "db1", Scheduler: "rr"}
	def := &sched.Service{Name: "legacy", Scheduler: "rr"}
	a := netip.MustParseAddrPort("127.0.0.1:5432")
	rs, err := sched.NewRoutes([]sched.Route{
		{Service: db1, Names: []string{"db1.example.com"}, ALPN: []string{"postgresql"}},
		{Service: def, Names: []string{"*"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tbl := sched.NewTable(1, []*sched.Service{db1, def}, map[netip.AddrPort]*sched.Service{a: db1})
	tbl.Routed = map[netip.AddrPort]*sched.Routes{a: rs}
	src := emptySource()
	src.Snapshot = snapOf(tbl)
	src.Sockets = func() []listener.SocketStats {
		return []listener.SocketStats{{Listen: a, Addr: a.String(), Accepts: 9, Refused: map[string]uint64{"no-route": 2, "preread-timeout": 1}}}
	}

	st := Snapshot(src)
	if len(st.Listeners) != 1 {
		t.Fatalf("listeners = %+v", st.Listeners)
	}
	ls := st.Listeners[0]
	if len(ls.Routes) != 2 || ls.Routes[0].Service != "db1" || !slices.Equal(ls.Routes[0].SNI, []string{"db1.example.com"}) ||
		!slices.Equal(ls.Routes[0].ALPN, []string{"postgresql"}) || ls.Routes[1].Service != "legacy" || !slices.Equal(ls.Routes[1].SNI, []string{"*"}) {
		t.Errorf("routes = %+v", ls.Routes)
	}
	if ls.Refused["no-route"] != 2 || ls.Refused["preread-timeout"] != 1 {
		t.Errorf("refused = %v", ls.Refused)
	}

	var table strings.Builder
	WriteTable(&table, st)
	if want := "routes on 127.0.0.1:5432  refused: no-route 2, preread-timeout 1\n" +
		"  db1.example.com alpn postgresql  → db1\n  *                                → legacy\n"; !strings.Contains(table.String(), want) {
		t.Errorf("WriteTable lacks\n%s\nin\n%s", want, table.String())
	}

	srv := httptest.NewServer(Handler(src))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`fulcrum_listener_refused_total{listen="127.0.0.1:5432",reason="no-route"} 2`,
		`fulcrum_listener_refused_total{listen="127.0.0.1:5432",reason="preread-timeout"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
