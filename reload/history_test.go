package reload

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"fulcrum/internal/testkit"
	"fulcrum/status"
)

// TestServiceHistory: a service that runs on its fallback says so (a log
// line at the start and at the end, its state and since when, a count),
// each backend keeps its transitions and downtime, the ring keeps every
// change across a reload, and a connection ended without a backend is
// counted by its end reason.
func TestServiceHistory(t *testing.T) {
	testkit.CheckLeaks(t)
	w := testkit.NewServer(t, testkit.Greeter("writer"))
	replica := testkit.DeadAddr(t)
	dead := testkit.DeadAddr(t)
	health := func(s string) string {
		return "[services." + s + ".health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	}
	services := []svc{
		{name: "ro", listen: []string{"127.0.0.1:0"}, extra: "fallback = \"rw\"\n" + health("ro"), backends: []be{{"r", replica, 1, ""}}},
		{name: "rw", listen: []string{"127.0.0.2:0"}, extra: health("rw"), backends: []be{{"w", w.Addr, 1, ""}}},
		{name: "lone", listen: []string{"127.0.0.3:0"}, backends: []be{{"x", dead, 1, ""}}},
	}
	dir := t.TempDir()
	r := startRun(t, dir, render(services...))
	fellBack := r.logs.Wait(t, 5*time.Second, "ro on its fallback", func(m map[string]any) bool {
		return m["service"] == "ro" && m["fallback"] == "rw"
	})
	if !strings.Contains(fellBack["message"].(string), "new connections go to service rw") {
		t.Errorf("fallback line %q; want it to name the service that serves", fellBack["message"])
	}
	if st := r.m.Watcher().State("ro"); st.Serving != status.ServingFallback || st.Fallback != "rw" || st.Fallbacks != 1 || st.Since.IsZero() {
		t.Errorf("ro's state on its fallback: %+v; want fallback rw, once, with a since", st)
	}
	if name, err := testkit.Greeting(r.addr("127.0.0.1:0")); name != "writer" {
		t.Errorf("ro on its fallback: %q, %v; want the writer", name, err)
	}
	r.logs.Wait(t, 5*time.Second, "the access line naming the fallback", func(m map[string]any) bool {
		return m["message"] == "connection" && m["service"] == "ro" && m["backend"] == "w" && m["fallback"] == "rw"
	})
	testkit.NewServerAt(t, replica, testkit.Greeter("replica"))
	r.logs.Wait(t, 5*time.Second, "ro back on its own", func(m map[string]any) bool {
		return m["service"] == "ro" && m["was"] == "fallback rw"
	})
	if st := r.m.Watcher().State("ro"); st.Serving != status.ServingOwn || st.Fallbacks != 1 {
		t.Errorf("ro's state with its replica back: %+v; want own, fallbacks still 1", st)
	}

	// A dial that fails with nowhere else to go: counted as its access line ends.
	c, err := net.Dial("tcp", r.addr("127.0.0.3:0"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a connection to a dead backend read a byte; want it closed")
	}
	c.Close()
	if n := r.admission("lone").Unserved["connect failed"]; n != 1 {
		t.Errorf("lone's connections ended with connect failed: %d; want 1", n)
	}

	// A reload keeps the ring and the backends' history.
	services[2].extra = "connect_timeout = \"2s\"\n"
	renameOver(t, r.path, render(services...))
	r.expectGen(2, 5*time.Second)
	b := r.srv.Snapshot().Service("ro").Targets[0].B
	if h := b.History(time.Now()); h.Transitions != 2 || h.Downtime <= 0 {
		t.Errorf("ro/r's history: %+v; want 2 transitions (down, up) and some downtime", h)
	}
	var got []string
	reloads := 0
	for _, e := range r.m.Events() {
		if e.Service == "ro" {
			got = append(got, e.Backend+": "+e.From+" → "+e.To)
		}
		if e.Service == "" && e.From == "generation 1" && e.To == "generation 2" {
			reloads++
		}
	}
	if reloads != 1 {
		t.Errorf("the reload is in the events %d times; want once", reloads)
	}
	want := []string{"r: up → down", ": own → fallback rw", "r: down → up", ": fallback rw → own"}
	if !slices.Equal(got, want) {
		t.Errorf("ro's events after a reload: %q; want %q", got, want)
	}
	if ev := r.m.Events(); len(ev) == 0 || ev[0].Seq != 1 || ev[0].At.IsZero() || ev[0].Reason == "" {
		t.Errorf("first event %+v; want seq 1, a time and a reason", ev)
	}
}

// TestUnresolvedAddressShown: status names a backend given by host name
// with that name, "(unresolved)" until it has an address, and the address
// once it has one — never "invalid AddrPort".
func TestUnresolvedAddressShown(t *testing.T) {
	b := testkit.NewServer(t, greetEcho("b"))
	dns := &dnsStub{}
	port := b.Addr[strings.LastIndex(b.Addr, ":")+1:]
	text := render(svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{name: "b", addr: "b.test:" + port, weight: 1}}})
	r := startRun(t, t.TempDir(), text, func(o *Options) { o.Lookup = dns.lookup })
	addr := func() string {
		return status.Of(status.Source{Snapshot: r.m.srv.Snapshot}).Services[0].Backends[0].Address
	}
	if got, want := addr(), "b.test:"+port+" (unresolved)"; got != want {
		t.Errorf("address before the name resolves: %q; want %q", got, want)
	}
	dns.set("b.test", netip.MustParseAddr("127.0.0.1"))
	r.hup <- struct{}{}
	r.expectGen(2, 10*time.Second)
	if got, want := addr(), "b.test:"+port+" (127.0.0.1:"+port+")"; got != want {
		t.Errorf("address once resolved: %q; want %q", got, want)
	}
}

// TestHealthyStartQuiet: a backend waiting for its first role check is out
// of rotation for a moment at every start; that is not a warning, nor
// history (no event, no transition).
func TestHealthyStartQuiet(t *testing.T) {
	testkit.CheckLeaks(t)
	rd := testkit.StartRedis(t)
	health := "[services.rw.health]\ncheck = \"redis\"\nrole = \"primary\"\ninterval = \"500ms\"\ntimeout = \"500ms\"\nrise = 1\nfall = 1\n"
	r := startRun(t, t.TempDir(), render(svc{name: "rw", listen: []string{"127.0.0.1:0"}, scheduler: "first",
		extra: health, backends: []be{{"a", rd.Addr, 1, ""}}}))
	r.logs.Wait(t, 10*time.Second, "a up", backendLine("backend up", "a"))
	if warned := r.logs.All(func(m map[string]any) bool { return m["message"] == "backend down" && m["level"] == "warn" }); len(warned) > 0 {
		t.Errorf("a healthy start warned %v", warned)
	}
	if h := r.srv.Snapshot().Service("rw").Targets[0].B.History(time.Now()); h.Transitions != 0 || h.Downtime != 0 {
		t.Errorf("history after a healthy start: %+v; want none", h)
	}
	if ev := r.m.Events(); len(ev) != 0 {
		t.Errorf("events after a healthy start: %+v; want none", ev)
	}
}

// TestHoldingLogged: a service with hold_timeout whose every backend is
// down says, once, that it holds new connections and for how long, and
// once that a backend is eligible again; a reload to a file with weights
// an unweighted scheduler ignores warns.
func TestHoldingLogged(t *testing.T) {
	testkit.CheckLeaks(t)
	addr := testkit.DeadAddr(t)
	health := "[services.rw.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n"
	s := svc{name: "rw", listen: []string{"127.0.0.1:0"}, extra: "hold_timeout = \"10s\"\n" + health, backends: []be{{"a", addr, 1, ""}}}
	r := startRun(t, t.TempDir(), render(s))
	r.logs.Wait(t, 5*time.Second, "holding", func(m map[string]any) bool {
		return m["service"] == "rw" && m["message"] == "no eligible backend; holding new connections up to 10s"
	})
	if st := r.m.Watcher().State("rw"); st.Serving != status.ServingHolding {
		t.Errorf("rw's state: %+v; want holding", st)
	}
	testkit.NewServerAt(t, addr, greetEcho("a"))
	r.logs.Wait(t, 5*time.Second, "the end of the hold", func(m map[string]any) bool {
		return m["service"] == "rw" && m["was"] == "holding" && m["message"] == "a backend of its own is eligible again"
	})
	s.scheduler, s.backends = "lc", append(s.backends, be{"b", addr, 3, ""})
	s.backends[1].name = "b"
	renameOver(t, r.path, render(s))
	r.logs.Wait(t, 5*time.Second, "the weights warning", func(m map[string]any) bool {
		msg, _ := m["message"].(string)
		return m["level"] == "warn" && strings.HasPrefix(msg, `services.rw: scheduler "lc" ignores weights`)
	})
}

// TestWeightZeroSince: a drain by weight 0 is dated from the reload that
// set it, not from when the backend last came up.
func TestWeightZeroSince(t *testing.T) {
	a := testkit.NewServer(t, greetEcho("a"))
	s := svc{name: "s", listen: []string{"127.0.0.1:0"}, extra: "[services.s.health]\ncheck = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n",
		backends: []be{{"a", a.Addr, 1, ""}, {"b", a.Addr, 1, ""}}}
	r := startRun(t, t.TempDir(), render(s))
	since := func() time.Time {
		return status.Of(status.Source{Snapshot: r.m.srv.Snapshot}).Services[0].Backends[0].Since
	}
	started := time.Now()
	s.backends[0].weight = 0
	renameOver(t, r.path, render(s))
	r.expectGen(2, 5*time.Second)
	if got := since(); got.Before(started) {
		t.Errorf("a drained by weight 0 since %v; want no earlier than the reload (%v)", got, started)
	}
}

// TestRefusedReloadEvent: a file that is refused is in the events, with
// its first problem, beside the generation that keeps serving.
func TestRefusedReloadEvent(t *testing.T) {
	a := testkit.NewServer(t, greetEcho("a"))
	s := svc{name: "s", listen: []string{"127.0.0.1:0"}, backends: []be{{"a", a.Addr, 1, ""}}}
	r := startRun(t, t.TempDir(), render(s))
	s.scheduler = "leastconn"
	renameOver(t, r.path, render(s))
	r.expectRefused(`did you mean "wlc"?`, 5*time.Second)
	ev := r.m.Events()
	if len(ev) != 1 || ev[0].From != "generation 1" || ev[0].To != "reload refused" || !strings.Contains(ev[0].Reason, "leastconn") {
		t.Errorf("events after a refused reload: %+v; want one, naming the problem", ev)
	}
}
