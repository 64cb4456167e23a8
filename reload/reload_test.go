package reload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"fulcrum/conf"
	"fulcrum/listener"
)

type harness struct {
	t   *testing.T
	srv *listener.Server
	m   *Manager
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t}
	log := zerolog.New(io.Discard)
	h.srv = listener.New(log)
	h.m = New("", h.srv, log, Options{})
	t.Cleanup(func() { h.m.Shutdown(context.Background()) })
	return h
}

// config renders a one-service file; backends are "name=addr/weight".
func config(t *testing.T, listen []string, scheduler string, backends ...string) *conf.Config {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "[services.s]\nlisten = [%q", listen[0])
	for _, l := range listen[1:] {
		fmt.Fprintf(&b, ", %q", l)
	}
	fmt.Fprintf(&b, "]\nscheduler = %q\n", scheduler)
	for _, be := range backends {
		var name, addr string
		var w int
		fmt.Sscanf(strings.NewReplacer("=", " ", "/", " ").Replace(be), "%s %s %d", &name, &addr, &w)
		fmt.Fprintf(&b, "[[services.s.backends]]\nname = %q\naddress = %q\nweight = %d\n", name, addr, w)
	}
	cfg, err := conf.Parse("test.toml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestApplyKeepsIdentity(t *testing.T) {
	h := newHarness(t)
	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "wrr", "a=127.0.0.1:1/1", "b=127.0.0.1:2/1")); err != nil {
		t.Fatal(err)
	}
	t1 := h.srv.Snapshot()
	a, b := t1.Services[0].Targets[0].B, t1.Services[0].Targets[1].B
	a.Acquire(0) // a live connection's slot, carried across the reload
	defer a.Release()

	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "wrr", "a=127.0.0.1:1/5", "c=127.0.0.1:3/1")); err != nil {
		t.Fatal(err)
	}
	t2 := h.srv.Snapshot()
	if t2.Gen != t1.Gen+1 {
		t.Errorf("gen = %d; want %d", t2.Gen, t1.Gen+1)
	}
	if got := t2.Services[0].Targets[0]; got.B != a || got.Weight != 5 || got.B.Active() != 1 {
		t.Errorf("kept backend a = %+v (active %d); want the same object, weight 5, active 1", got, got.B.Active())
	}
	if !b.Draining() {
		t.Error("removed backend b is not draining")
	}
	if c := t2.Services[0].Targets[1].B; c == b || c.Name != "c" {
		t.Errorf("new backend = %s", c.Name)
	}
}

// TestApplyReAddDraining: a backend removed while it still has connections,
// then added back, gets its live object back and takes connections again.
func TestApplyReAddDraining(t *testing.T) {
	h := newHarness(t)
	cfg := config(t, []string{"127.0.0.1:0"}, "rr", "a=127.0.0.1:1/1", "b=127.0.0.1:2/1")
	if err := h.m.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	b := h.srv.Snapshot().Services[0].Targets[1].B
	b.Acquire(0) // an open connection keeps it draining
	defer b.Release()
	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "rr", "a=127.0.0.1:1/1")); err != nil {
		t.Fatal(err)
	}
	if !b.Draining() || b.Acquire(0) {
		t.Fatal("removed backend takes new connections")
	}
	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "rr", "a=127.0.0.1:1/1", "b=127.0.0.1:2/1")); err != nil {
		t.Fatal(err)
	}
	if got := h.srv.Snapshot().Services[0].Targets[1].B; got != b || got.Draining() || got.Active() != 1 {
		t.Errorf("re-added backend: same object %v, draining %v, active %d; want the live one back", got == b, got.Draining(), got.Active())
	}
	if !b.Acquire(0) {
		t.Error("re-added backend refuses connections")
	}
	b.Release()
}

func TestApplyUnchangedKeepsPicker(t *testing.T) {
	h := newHarness(t)
	cfg := config(t, []string{"127.0.0.1:0"}, "wrr", "a=127.0.0.1:1/3", "b=127.0.0.1:2/1")
	if err := h.m.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	p1 := h.srv.Snapshot().Services[0].Picker
	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "wrr", "a=127.0.0.1:1/3", "b=127.0.0.1:2/1")); err != nil {
		t.Fatal(err)
	}
	if p2 := h.srv.Snapshot().Services[0].Picker; p2 != p1 {
		t.Error("unchanged service got a new picker; its cursor would restart")
	}
}

// TestApplyBindFailure: a listener that cannot be bound aborts the reload;
// the old table and listeners keep serving.
func TestApplyBindFailure(t *testing.T) {
	h := newHarness(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	first := netip.MustParseAddrPort("127.0.0.1:0")
	if err := h.m.Apply(config(t, []string{first.String()}, "rr", "a=127.0.0.1:1/1")); err != nil {
		t.Fatal(err)
	}
	old := h.srv.Snapshot()
	bound := h.srv.Addr(first)
	free, err := net.Listen("tcp", "127.0.0.1:0") // a port that is free now
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	err = h.m.Apply(config(t, []string{first.String(), freeAddr, busy.Addr().String()}, "rr", "a=127.0.0.1:1/1"))
	if err == nil {
		t.Fatal("Apply with a busy address succeeded")
	}
	if h.srv.Snapshot() != old {
		t.Error("table swapped despite the failure")
	}
	if h.srv.Addr(first) != bound {
		t.Error("the kept listener was touched")
	}
	if h.srv.Addr(netip.MustParseAddrPort(freeAddr)) != nil {
		t.Error("a listener opened by the failed reload is still registered")
	}
	if l, err := net.Listen("tcp", freeAddr); err != nil {
		t.Errorf("the failed reload left %s bound: %v", freeAddr, err)
	} else {
		l.Close()
	}
}

// state is what a refused reload must leave exactly as it was: the table,
// the pool, each service's admission state and the reload history.
type state struct {
	table  *listener.Snapshot // the table with its policies
	pool   int
	rates  map[string][2]float64
	status Status
}

func (h *harness) state() state {
	st := state{table: h.srv.Snapshot(), pool: h.m.pool.Len(), rates: map[string][2]float64{}, status: h.m.Status()}
	for _, s := range st.table.Services {
		a, _ := h.srv.Admission(s.Name)
		st.rates[s.Name] = [2]float64{a.Rate, float64(a.Burst)}
	}
	return st
}

// TestApplyRefusedChangesNothing: a reload refused at the bind leaves the
// running service's accept rate, the pool's membership and the table as
// they were; the same file without the busy address then applies all of it.
func TestApplyRefusedChangesNothing(t *testing.T) {
	h := newHarness(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// file is the running configuration, or with a second listen address
	// the next one: an accept_rate and a new backend.
	file := func(listen ...string) *conf.Config {
		text := "[services.s]\nlisten = [\"" + strings.Join(listen, `", "`) + "\"]\n"
		if len(listen) > 1 {
			text += "accept_rate = 0.001\n[[services.s.backends]]\naddress = \"127.0.0.1:2\"\n"
		}
		text += "[[services.s.backends]]\naddress = \"127.0.0.1:1\"\n"
		cfg, err := conf.Parse("test.toml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if err := h.m.Apply(file("127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	before := h.state()
	if err := h.m.Apply(file("127.0.0.1:0", busy.Addr().String())); err == nil {
		t.Fatal("Apply with a busy address succeeded")
	}
	if after := h.state(); !reflect.DeepEqual(before, after) {
		t.Errorf("a refused reload changed the running state:\nbefore %+v\nafter  %+v", before, after)
	}
	if a, _ := h.srv.Admission(h.srv.Snapshot().Services[0].Name); a.Rate != 0 {
		t.Error("the running service is rate limited after a refused reload")
	}
	busy.Close()
	if err := h.m.Apply(file("127.0.0.1:0", busy.Addr().String())); err != nil {
		t.Fatal(err)
	}
	if after := h.state(); after.pool != 2 || after.rates["s"][0] != 0.001 || after.table.Gen != before.table.Gen+1 {
		t.Errorf("applied reload: pool %d, rate %v, gen %d; want 2, 0.001, %d", after.pool, after.rates["s"], after.table.Gen, before.table.Gen+1)
	}
}

// TestTableSeq: a health rebuild keeps the generation but every table has
// its own number.
func TestTableSeq(t *testing.T) {
	h := newHarness(t)
	if err := h.m.Apply(config(t, []string{"127.0.0.1:0"}, "rr", "a=127.0.0.1:1/1")); err != nil {
		t.Fatal(err)
	}
	t1 := h.srv.Snapshot()
	h.m.refresh()
	t2 := h.srv.Snapshot()
	if t2 == t1 || t2.Gen != t1.Gen || t2.Seq == t1.Seq {
		t.Errorf("refresh: gen %d → %d, seq %d → %d; want the same gen and a new seq", t1.Gen, t2.Gen, t1.Seq, t2.Seq)
	}
}

// TestShutdownDeadline: with drain_timeout 0 (wait for ever), Shutdown's
// context bounds the wait: open sessions are closed when it ends.
func TestShutdownDeadline(t *testing.T) {
	h := &harness{t: t}
	h.srv = listener.New(zerolog.Nop())
	h.m = New("", h.srv, zerolog.Nop(), Options{})
	be, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	go func() { // exits when be is closed; holds each connection open
		for {
			c, err := be.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	cfg, err := conf.Parse("t.toml", []byte(fmt.Sprintf("[services.s]\nlisten = [\"127.0.0.1:0\"]\ndrain_timeout = \"0s\"\n[[services.s.backends]]\naddress = %q\n", be.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", h.srv.Addr(netip.MustParseAddrPort("127.0.0.1:0")).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := h.srv.Snapshot().Services[0].Targets[0].B
	for deadline := time.Now().Add(10 * time.Second); b.Active() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session never started")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.m.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v; want the context's deadline", err)
	}
	if n := b.Active(); n != 0 {
		t.Errorf("%d sessions still open after Shutdown returned", n)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the client's connection is still open")
	}
}
