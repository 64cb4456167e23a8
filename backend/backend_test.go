package backend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

func TestAcquireMax(t *testing.T) {
	b := New("s", "a")
	const max, workers = 5, 8
	var peak, cur atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() { // exits after its attempts
			defer wg.Done()
			for range 2000 {
				if !b.Acquire(max) {
					continue
				}
				n := cur.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				cur.Add(-1)
				b.Release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > max || p < 1 {
		t.Errorf("peak holders = %d; want 1..%d", p, max)
	}
	if a := b.Active(); a != 0 {
		t.Errorf("active = %d after all released", a)
	}
	if got := b.Stats().Total; got == 0 {
		t.Error("total not counted")
	}
}

type closer struct{ closed atomic.Bool }

func (c *closer) Close() error { c.closed.Store(true); return nil }

// TestDrainDeadline: sessions still open at the deadline are closed and
// counted; new slots are refused meanwhile.
func TestDrainDeadline(t *testing.T) {
	b := New("s", "a")
	sessions := []*closer{{}, {}}
	for _, s := range sessions {
		if !b.Acquire(0) || !b.Track(s) {
			t.Fatal("acquire/track failed")
		}
	}
	start := time.Now() // before the deadline is set, so the span covers it
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- b.Drain(ctx) }() // exits at the deadline
	n := <-done
	if b.Acquire(0) {
		t.Error("Acquire succeeded while draining")
	}
	if el := time.Since(start); el < 200*time.Millisecond || el > 2*time.Second {
		t.Errorf("Drain returned after %v; want about 200ms", el)
	}
	if n != 2 || !sessions[0].closed.Load() || !sessions[1].closed.Load() {
		t.Errorf("Drain closed %d; want both sessions closed", n)
	}
	if b.Track(&closer{}) {
		t.Error("Track succeeded after the drain deadline")
	}
}

// TestDrainEnds: Drain returns, closing nothing, once the last session ends.
func TestDrainEnds(t *testing.T) {
	b := New("s", "a")
	s := &closer{}
	b.Acquire(0)
	b.Track(s)
	done := make(chan int, 1)
	go func() { done <- b.Drain(context.Background()) }() // exits when the session ends
	b.Untrack(s)
	b.Release()
	select {
	case n := <-done:
		if n != 0 || s.closed.Load() {
			t.Errorf("Drain closed %d sessions; want 0", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last session ended")
	}
}

// TestUndrain: a re-added backend stops its drain and takes connections.
func TestUndrain(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	b.Acquire(0)
	done := make(chan int, 1)
	go func() { done <- b.Drain(context.Background()) }() // exits when undrained
	testkit.WaitFor(t, 5*time.Second, func() error {
		if !b.Draining() { // Drain sets the bit with no event
			return errors.New("backend s/a: not draining; want draining after Drain")
		}
		return nil
	})
	if got := p.Get("s", "a"); got != b {
		t.Fatal("Pool.Get returned a new backend for a draining name")
	}
	b.Undrain()
	if n := <-done; n != 0 {
		t.Errorf("Drain closed %d", n)
	}
	p.Forget(b) // not draining: kept
	if p.Get("s", "a") != b || !b.Acquire(0) {
		t.Error("undrained backend lost or refusing")
	}
	b.Release()
	b.Release()
	b.Drain(context.Background())
	p.Forget(b)
	if p.Len() != 0 {
		t.Error("drained backend not forgotten")
	}
}

// TestCut closes every tracked session at once and counts them, without
// draining the backend.
func TestCut(t *testing.T) {
	b := New("s", "a")
	sessions := []*closer{{}, {}, {}}
	for _, s := range sessions {
		b.Acquire(0)
		b.Track(s)
	}
	if n := b.Cut(CutDown); n != 3 {
		t.Fatalf("Cut = %d; want 3", n)
	}
	for i, s := range sessions {
		if !s.closed.Load() {
			t.Errorf("session %d still open", i)
		}
	}
	if b.Draining() || !b.Acquire(0) {
		t.Error("Cut drained the backend")
	}
	if s := b.Stats(); s.CutClosed != 3 {
		t.Errorf("CutClosed = %d; want 3", s.CutClosed)
	}
}

// epochSession is a tracked session that says the role epoch it was dialled in.
type epochSession struct {
	closer
	epoch uint64
	end   atomic.Pointer[string]
}

func (s *epochSession) RoleEpoch() uint64 { return s.epoch }
func (s *epochSession) Cut(end string)    { s.end.Store(&end); s.closed.Store(true) }

// TestCutRoleSparesSessionsOfTheNewRole: on_role_change ends the sessions
// dialled while the node was in its old role, not those dialled once its
// check saw the new one. The failover drill's held writers dial the
// promoted replica as soon as its check passes (listener.Server.Kick), before the
// health controller runs the role-change cut; cutting them refused the
// clients the hold was for (TestDrillFailover's flake: writers ended as
// "role change" with the startup packet sent and no reply).
func TestCutRoleSparesSessionsOfTheNewRole(t *testing.T) {
	var p Pool
	b := p.Get("s", "b")
	b.observed(RoleReplica, 0, true)
	old := &epochSession{epoch: b.RoleEpoch()} // dialled as a replica
	b.Track(old)
	plain := &closer{} // a session that tells no epoch is cut as before
	b.Track(plain)
	if !b.observed(RolePrimary, 0, true) {
		t.Fatal("promotion not seen as a role change")
	}
	fresh := &epochSession{epoch: b.RoleEpoch()} // dialled once the check saw it primary
	b.Track(fresh)
	if n := b.CutRole(CutRoleChange); n != 2 {
		t.Errorf("CutRole cut %d sessions; want 2 (the one dialled in the old role, and the one that tells none)", n)
	}
	if e := old.end.Load(); e == nil || *e != CutRoleChange {
		t.Errorf("the session of the old role ended as %v; want %q", e, CutRoleChange)
	}
	if !plain.closed.Load() {
		t.Error("a session without an epoch was not cut")
	}
	if fresh.closed.Load() {
		t.Fatal("the session dialled in the new role was cut")
	}
	if n := b.Cut(CutDown); n != 1 || !fresh.closed.Load() { // still tracked: a later cut reaches it
		t.Errorf("Cut after CutRole cut %d sessions (fresh closed %v); want the one left", n, fresh.closed.Load())
	}
	if got := b.Stats().CutClosed; got != 3 {
		t.Errorf("CutClosed = %d; want 3", got)
	}
}

// TestTrackSinceAfterCutRole: a session dialled in the old role that is
// tracked only after CutRole ran is cut as "role change"; one dialled in
// the new role is tracked, even with a view older than that CutRole.
func TestTrackSinceAfterCutRole(t *testing.T) {
	var p Pool
	b := p.Get("s", "b")
	b.observed(RoleReplica, 0, true)
	view := time.Now()
	late := &epochSession{epoch: b.RoleEpoch()} // dialled as a replica, not yet tracked
	b.observed(RolePrimary, 0, true)
	fresh := &epochSession{epoch: b.RoleEpoch()}
	b.CutRole(CutRoleChange)
	if ok, cut := b.TrackSince(late, view); !ok || cut != CutRoleChange {
		t.Errorf("TrackSince of a session of the old role after CutRole = %v, %q; want true, %q", ok, cut, CutRoleChange)
	}
	if ok, cut := b.TrackSince(fresh, view); !ok || cut != "" {
		t.Errorf("TrackSince of a session of the new role after CutRole = %v, %q; want tracked", ok, cut)
	}
}
