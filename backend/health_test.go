package backend

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCheckedRiseFall: fall failures in a row mark the backend down, rise
// successes bring it back; each transition is reported once.
func TestCheckedRiseFall(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	ok := true
	check := func() error {
		if ok {
			return nil
		}
		return fmt.Errorf("refused")
	}
	now := time.Now()
	for range 2 {
		ok = false
		b.checked(check(), false, 2, 3, now)
	}
	if b.Down() {
		t.Fatal("down after 2 failures; fall is 3")
	}
	b.checked(check(), false, 2, 3, now)
	if !b.Down() {
		t.Fatal("not down after 3 failures")
	}
	if got := <-changes; got != b {
		t.Fatal("no report of the transition")
	}
	b.Seen()
	ok = true
	b.checked(check(), false, 2, 3, now)
	if !b.Down() {
		t.Fatal("up after 1 success; rise is 2")
	}
	b.checked(check(), false, 2, 3, now.Add(time.Second))
	if b.Down() {
		t.Fatal("still down after 2 successes")
	}
	if up, reason, since := b.Health(); !up || !strings.Contains(reason, "passed 2 times") || !since.Equal(now.Add(time.Second)) {
		t.Errorf("Health = %v, %q, %v", up, reason, since)
	}
	select {
	case <-changes:
	default:
		t.Error("no report of the way back up")
	}
}

// TestPassiveThenChecks: a passive mark resets the check count; rise
// passing checks then clear it, without waiting for fail_timeout.
func TestPassiveThenChecks(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	now := time.Now()
	b.checked(nil, false, 2, 3, now)
	b.checked(nil, false, 2, 3, now)
	b.PassiveFail(1, time.Hour, now)
	if !b.Down() {
		t.Fatal("not down after max_fails")
	}
	b.checked(nil, false, 2, 3, now)
	if !b.Down() {
		t.Fatal("one passing check cleared the passive mark; rise is 2")
	}
	b.checked(nil, false, 2, 3, now)
	if b.Down() {
		t.Fatal("rise passing checks did not clear the passive mark")
	}
	if b.ExpirePassive(now) != (time.Time{}) {
		t.Error("a passive expiry is still pending")
	}
}

func TestPassive(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	now := time.Now()
	if b.PassiveFail(3, 10*time.Second, now) || b.PassiveFail(3, 10*time.Second, now) {
		t.Fatal("down before max_fails")
	}
	b.PassiveOK() // a success starts the count again
	b.PassiveFail(3, 10*time.Second, now)
	b.PassiveFail(3, 10*time.Second, now)
	if b.Down() {
		t.Fatal("down although a success reset the count")
	}
	if !b.PassiveFail(3, 10*time.Second, now.Add(time.Second)) || !b.Down() {
		t.Fatal("not down after 3 failures within fail_timeout")
	}
	if next := b.ExpirePassive(now.Add(5 * time.Second)); next.IsZero() || !b.Down() {
		t.Fatal("passive mark lifted before fail_timeout")
	}
	if next := b.ExpirePassive(now.Add(12 * time.Second)); !next.IsZero() || b.Down() {
		t.Fatal("passive mark not lifted after fail_timeout")
	}
	// Failures spread wider than the window never add up.
	for i := range 5 {
		b.PassiveFail(3, time.Second, now.Add(time.Duration(i)*2*time.Second))
	}
	if b.Down() {
		t.Error("failures 2s apart took it down with a 1s window")
	}
}

// TestWrongRole: the first answer in the wrong role makes the backend
// StateWrongRole at once (not after fall), not down, and never eligible;
// fall failures make it down; rise answers in the right role bring it
// back. Each change of state is reported.
func TestWrongRole(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	now := time.Now()
	wrong := errors.New("answers as replica, want primary")
	b.observed(RoleReplica, 0, true)
	b.checked(wrong, true, 2, 3, now) // one answer decides: fall is 3
	if st, role := b.State(); st != StateWrongRole || role != RoleReplica || !b.Down() {
		t.Fatalf("State = %v, %q, Down %v; want wrong role, replica, true", st, role, b.Down())
	}
	if up, reason, _ := b.Health(); up || !strings.Contains(reason, "answers as replica, want primary") {
		t.Errorf("Health = %v, %q", up, reason)
	}
	report := func(what string) {
		t.Helper()
		select {
		case <-changes:
			b.Seen()
		default:
			t.Errorf("no report of %s", what)
		}
	}
	report("up → wrong role")
	for range 2 {
		b.checked(fmt.Errorf("connection refused"), false, 2, 3, now)
	}
	if st, _ := b.State(); st != StateDown {
		t.Fatalf("State after a failure = %v; want down", st)
	}
	report("wrong role → down")
	b.checked(wrong, true, 2, 3, now)
	if st, _ := b.State(); st != StateWrongRole {
		t.Fatalf("State after a wrong-role answer = %v; want wrong role", st)
	}
	report("down → wrong role")
	b.observed(RolePrimary, 0, true)
	b.checked(nil, false, 2, 3, now)
	b.checked(nil, false, 2, 3, now)
	if st, role := b.State(); st != StateUp || role != RolePrimary || b.Down() {
		t.Fatalf("State = %v, %q; want up, primary", st, role)
	}
	report("wrong role → up")
	if StateWrongRole.String() != "wrong role" {
		t.Errorf("StateWrongRole = %q", StateWrongRole)
	}
}

// TestAwaitRole: a backend whose role was never checked is out of rotation
// until its first check, which decides at once; once a role was seen,
// AwaitRole does nothing.
func TestAwaitRole(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	b.AwaitRole(RolePrimary)
	if !b.Down() {
		t.Fatal("an unchecked backend is eligible")
	}
	b.observed(RolePrimary, 0, true)
	b.checked(nil, false, 3, 3, time.Now())
	if b.Down() {
		t.Fatal("the first passing role check did not bring it up at once")
	}
	b.AwaitRole(RolePrimary)
	if b.Down() {
		t.Error("AwaitRole took down a backend last seen in the role")
	}
	// The service now wants a replica of a node last seen as primary: out
	// until the next check, which decides at once.
	b.AwaitRole(RoleReplica)
	if !b.Down() {
		t.Error("a node last seen as primary stays eligible for a replica service")
	}
	b.observed(RolePrimary, 0, true)
	b.checked(errors.New("answers as primary, want replica"), true, 3, 3, time.Now())
	if st, _ := b.State(); st != StateWrongRole {
		t.Errorf("after the next check: %v; want wrong role at once", st)
	}
	c := p.Get("s", "c")
	c.AwaitRole(RolePrimary)
	c.observed(RoleReplica, 0, true)
	c.checked(errors.New("answers as replica, want primary"), true, 3, 3, time.Now())
	if st, _ := c.State(); st != StateWrongRole {
		t.Errorf("first check in the wrong role: %v; want wrong role at once", st)
	}
}

// TestAwaitRoleQuiet: a backend already in the wrong role keeps that state
// (no report) when a reload asks again; its next check still decides at once.
func TestAwaitRoleQuiet(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	b.AwaitRole(RoleReplica)
	b.observed(RolePrimary, 0, true)
	b.checked(errors.New("answers as primary, want replica"), true, 3, 3, time.Now())
	for len(changes) > 0 {
		(<-changes).Seen()
	}
	b.AwaitRole(RoleReplica)
	if st, _ := b.State(); st != StateWrongRole || len(changes) != 0 {
		t.Errorf("after AwaitRole again: %v with %d reports; want wrong role, none", st, len(changes))
	}
	b.observed(RoleReplica, 0, true)
	b.checked(nil, false, 3, 3, time.Now())
	if st, _ := b.State(); st != StateUp {
		t.Errorf("after one check in the right role: %v; want up at once", st)
	}
}

// TestFailedReasonCountsItsKind: a down backend's reason counts the checks
// that failed as the latest did, from when that kind of failure began, not
// every failure since the last pass (the operator trial saw "check failed
// 308 times: conn closed" where 308 were wrong-role answers before the
// node died).
func TestFailedReasonCountsItsKind(t *testing.T) {
	var p Pool
	b := p.Get("s", "a")
	start := time.Date(2026, 12, 1, 3, 4, 5, 0, time.Local)
	wrong := errors.New("answers as replica, want primary")
	b.observed(RoleReplica, 0, true)
	for i := range 5 {
		b.checked(wrong, true, 2, 3, start.Add(time.Duration(i)*time.Second))
	}
	died := start.Add(10 * time.Second)
	b.checked(errors.New("conn closed"), false, 2, 3, died)
	if _, reason, _ := b.Health(); reason != "check failed once: conn closed" {
		t.Fatalf("reason after the first failure of its kind = %q; want %q (fall counts every failure, the reason only its kind)", reason, "check failed once: conn closed")
	}
	for i := 1; i < 3; i++ {
		b.checked(errors.New("conn closed"), false, 2, 3, died.Add(time.Duration(i)*time.Second))
	}
	want := "check failed 3 times since " + died.Format("15:04:05") + ": conn closed"
	if _, reason, _ := b.Health(); reason != want {
		t.Errorf("reason = %q; want %q", reason, want)
	}
	b.checked(nil, false, 2, 3, died.Add(5*time.Second))
	b.checked(errors.New("timeout"), false, 2, 1, died.Add(6*time.Second))
	if _, reason, _ := b.Health(); reason != "check failed once: timeout" {
		t.Errorf("reason after a pass and one failure = %q; want %q", reason, "check failed once: timeout")
	}
}

// TestChecked: one check's outcome, as health hands it over. A failure
// for want of fulcrum's own resources is shown as the last check and
// changes nothing else, even with fall 1; a lag is kept until a check
// measures another, and one that measured none leaves it; a role change
// is reported even where the state stays.
func TestChecked(t *testing.T) {
	changes := make(chan *Backend, 10)
	p := Pool{Changes: changes}
	b := p.Get("s", "a")
	now := time.Now()
	b.Checked(Check{Start: now, Err: errors.New("too many open files"), Local: true}, 1, 1)
	if cs := b.Checks(); b.Down() || cs.Failed != 0 || cs.Count != 0 || !strings.Contains(cs.Last.Err, "not counted") {
		t.Fatalf("after a local failure: down %v, checks %+v; want up, none counted, the last shown", b.Down(), cs)
	}
	b.Checked(Check{Start: now, Took: time.Millisecond, Role: RoleReplica, RoleWanted: true, Lag: 3 * time.Second, LagSet: true}, 1, 1)
	b.Checked(Check{Start: now, Err: errors.New("refused")}, 2, 2) // measured nothing: the lag stands
	if lag, ok := b.Lag(); !ok || lag != 3*time.Second {
		t.Errorf("Lag = %v, %v; want 3s kept", lag, ok)
	}
	b.Checked(Check{Start: now, Role: RoleReplica, RoleWanted: true, Lag: -1, LagSet: true}, 1, 1)
	if lag, ok := b.Lag(); ok {
		t.Errorf("Lag = %v, known; want unknown", lag)
	}
	for len(changes) > 0 {
		(<-changes).Seen()
	}
	b.Checked(Check{Start: now, Role: RolePrimary, RoleWanted: true}, 1, 1) // promoted: up before, up now
	if len(changes) != 1 {
		t.Errorf("%d reports of a role change; want 1", len(changes))
	}
	if from, to, ok := b.TakeRoleChange(); !ok || from != RoleReplica || to != RolePrimary {
		t.Errorf("TakeRoleChange = %q, %q, %v; want replica, primary", from, to, ok)
	}
}
