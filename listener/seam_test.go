//go:build fulcrumseam

package listener

// Tests that force, through the test-only seam (seam.go), the races of the
// data path that are one syscall wide in production. Run them with
//
//	go test -race -tags fulcrumseam ./listener/
//
// which .ci/run does.

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// setSeam makes f run at every seam point until the test ends.
func setSeam(t *testing.T, f func(seamPoint, *session) error) {
	t.Helper()
	if !seamHook.CompareAndSwap(nil, &f) {
		t.Fatal("a seam hook is set already")
	}
	t.Cleanup(func() { seamHook.Store(nil) })
}

// woken reports whether h has had an event (kicked while begin holds it)
// or has run to its end (which only a loop that ran it early can do).
func woken(h *half) bool {
	s := h.state.Load()
	return s == stKicked || s == stDone
}

// victims are descriptors a test opens while a session may still close
// the numbers it had: each must stay open, and the same file.
type victims []victim

type victim struct {
	fd  int
	ino uint64
}

// openVictims opens sockets until one gets one of the numbers ss had (the
// kernel gives the lowest free one, as it would to the next connection),
// or 16 are open.
func openVictims(t *testing.T, ss *session) victims {
	var vs victims
	for range 16 {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Error(err) // not Fatal: called from the seam's goroutine
			return vs
		}
		t.Cleanup(func() { unix.Close(fd) })
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		vs = append(vs, victim{fd, st.Ino})
		if fd == ss.clientFD || fd == ss.backendFD {
			break
		}
	}
	return vs
}

func (vs victims) check(t *testing.T) {
	t.Helper()
	for _, v := range vs {
		var st unix.Stat_t
		if err := unix.Fstat(v.fd, &st); err != nil || st.Ino != v.ino {
			t.Errorf("descriptor %d the test opened: %v (inode %d, was %d): the proxy closed it", v.fd, err, st.Ino, v.ino)
		}
	}
}

// offLoop makes each connection detach before its dial (a queue to wait
// in detaches it), so that begin runs in a goroutine of its own. A test
// that pauses begin while a loop dispatches the session's events needs
// the two apart: a connection served inline runs begin in the loop that
// accepted it, which may be the session's, and then no event of the
// session is dispatched until begin is done.
func offLoop(s tuned) { s.QueueTimeout = time.Minute }

// TestBeginReset (C1): the client resets its connection while begin is
// between the two registrations, and the client socket's events have been
// dispatched. The session ends once, as reset: it closes no descriptor
// that is no longer its own (the test opens one in the window, which gets
// the lowest free number, as the kernel's next socket would), takes no
// other connection's slot, and logs one line.
func TestBeginReset(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, offLoop)
	keep := p.dial(t) // another session, holding a slot
	keep.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := keep.Write([]byte("k")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(keep, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	vc := make(chan victims, 1)
	var fired atomic.Bool
	setSeam(t, func(at seamPoint, ss *session) error {
		if at != seamRegistered || ss.srv != p.srv || fired.Swap(true) {
			return nil
		}
		if err := testkit.Until(10*time.Second, func() error {
			if !woken(&ss.up) || !woken(&ss.down) {
				return errors.New("the client's reset woke no half")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if ss.up.state.Load() == stDone { // ran early: await its close of the descriptors
			_ = testkit.Until(10*time.Second, func() error { // openVictims then finds them closed
				_, err := unix.FcntlInt(uintptr(ss.clientFD), unix.F_GETFD, 0)
				if err == nil {
					return errors.New("the client's descriptor is open")
				}
				return nil
			})
		}
		vc <- openVictims(t, ss)
		return nil
	})
	c := p.dial(t)
	c.SetLinger(0)
	c.Close()
	line := p.logs.Wait(t, 10*time.Second, "for the reset session", func(m map[string]any) bool {
		return isAccess(m) && m["end"] == endReset
	})
	if !fired.Load() {
		t.Fatal("the seam never ran")
	}
	v := <-vc
	v.check(t)
	p.settle(t, 1) // keep still holds its slot
	if n := len(p.logs.All(isAccess)); n != 1 {
		t.Errorf("%d access lines (the first %v); want 1", n, line)
	}
	keep.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := keep.Write([]byte("k")); err != nil {
		t.Errorf("keep: %v", err)
	} else if _, err := io.ReadFull(keep, make([]byte, 1)); err != nil {
		t.Errorf("keep: %v", err)
	}
	keep.Close()
	p.settle(t, 0)
	p.waitReturns(t)
	v.check(t)
}

// TestBeginUpload (C1): the client's upload is queued when begin registers
// its socket, and the loop would move it before the backend socket is in
// (its flush meets EAGAIN and arms EPOLLOUT on a socket not yet
// registered). Every byte arrives, and the session ends once.
func TestBeginUpload(t *testing.T) {
	testkit.CheckLeaks(t)
	const size = 16 << 20
	start := make(chan struct{})
	got := make(chan [32]byte, 1)
	// A small receive buffer, so that the proxy's writes to the backend
	// block long before the upload is through.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	be := testkit.Serve(t, ln.(*net.TCPListener), func(c *net.TCPConn) {
		<-start // reads only once the seam is passed: the proxy's writes would block
		h := sha256.New()
		io.Copy(h, testkit.User(c))
		got <- [32]byte(h.Sum(nil))
	})
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, offLoop)
	var fired atomic.Bool
	setSeam(t, func(at seamPoint, ss *session) error {
		if at != seamRegistered || ss.srv != p.srv || fired.Swap(true) {
			return nil
		}
		if err := testkit.Until(10*time.Second, func() error {
			if !woken(&ss.up) {
				return errors.New("the upload woke no half")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		// A loop that ran the half early would end it in this time (its
		// flush blocked on the backend); a held half stays kicked, and the
		// window passes.
		_ = testkit.Until(200*time.Millisecond, func() error {
			if ss.up.state.Load() != stDone {
				return errors.New("the half has not ended")
			}
			return nil
		})
		return nil
	})
	c := p.dial(t)
	werr := make(chan error, 1)
	go func() { // exits when the upload is written, or fails
		err := stream(testkit.User(c), 7, size)
		c.CloseWrite()
		werr <- err
	}()
	testkit.WaitFor(t, 10*time.Second, func() error {
		if !fired.Load() {
			return errors.New("the seam did not fire")
		}
		return nil
	})
	close(start)
	if err := <-werr; err != nil {
		t.Fatalf("upload: %v", err)
	}
	select {
	case sum := <-got:
		if sum != streamSum(7, size) {
			t.Error("the backend got other bytes than the client sent")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the backend saw no end of the upload within 30 s")
	}
	line := p.logs.Wait(t, 10*time.Second, "access", isAccess)
	if line["bytes_in"] != float64(size) || line["end"] != endClient {
		t.Errorf("access line %v; want bytes_in %d, end %q", line, size, endClient)
	}
	p.settle(t, 0)
	p.waitReturns(t)
	if n := len(p.logs.All(isAccess)); n != 1 {
		t.Errorf("%d access lines; want 1", n)
	}
}

// TestBeginRegisterFails (S1): register(backend) fails for real (ENOMEM,
// or ENOSPC at fs.epoll.max_user_watches) after the client socket's
// events came. The session ends once, as reset with that error, through
// the same stop and release as any other end.
func TestBeginRegisterFails(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil)
	vc := make(chan victims, 1)
	var fired atomic.Bool
	setSeam(t, func(at seamPoint, ss *session) error {
		if at != seamRegistered || ss.srv != p.srv || fired.Swap(true) {
			return nil
		}
		if err := testkit.Until(10*time.Second, func() error {
			if !woken(&ss.up) {
				return errors.New("the client's bytes woke no half")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		vc <- openVictims(t, ss)
		return unix.ENOMEM
	})
	c := p.dial(t)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 8)); err == nil || errors.Is(err, unix.EAGAIN) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("client read %d, %v; want the connection ended", n, err)
	}
	line := p.logs.Wait(t, 10*time.Second, "access", isAccess)
	if line["end"] != endReset || line["error"] != unix.ENOMEM.Error() {
		t.Errorf("access line %v; want end %q, error %q", line, endReset, unix.ENOMEM.Error())
	}
	v := <-vc
	v.check(t)
	p.settle(t, 0)
	p.waitReturns(t)
	v.check(t)
	if n := len(p.logs.All(isAccess)); n != 1 {
		t.Errorf("%d access lines; want 1", n)
	}
}

// TestCutBeforeBegin (C2): Cut (on_down = "close") reaches a session after
// it is tracked and before it begins. The session still ends, as drained,
// and Wait returns.
func TestCutBeforeBegin(t *testing.T) {
	for _, how := range []string{"cut", "idle"} {
		t.Run(how, func(t *testing.T) {
			testkit.CheckLeaks(t)
			be := testkit.NewServer(t, testkit.Echo)
			p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.IdleTimeout = time.Minute })
			var cut atomic.Int32
			setSeam(t, func(at seamPoint, ss *session) error {
				if at != seamTracked || ss.srv != p.srv {
					return nil
				}
				if how == "cut" {
					cut.Add(int32(ss.t.B.Cut(backend.CutDown)))
				} else {
					ss.stop() // a drain deadline, an idle timer, anything that stops
				}
				return nil
			})
			c := p.dial(t)
			c.Write([]byte("hello"))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("client read %d bytes and no end within 10 s: the session is wedged", len(n))
			}
			// Cut ends the session before it returns its count: the client
			// may see the end before the hook has added it. The access
			// line comes after the hook returned (admission's count is
			// given back after it).
			line := p.logs.Wait(t, 10*time.Second, "access", isAccess)
			if how == "cut" && cut.Load() != 1 {
				t.Errorf("Cut closed %d sessions; want 1", cut.Load())
			}
			if how == "cut" && line["end"] != backend.CutDown {
				t.Errorf("access line %v; want end %q", line, backend.CutDown)
			}
			p.settle(t, 0)
			p.waitReturns(t)
		})
	}
}

// TestDownBeforeTrack (S2): a backend with on_down = "close" goes down
// while a client's dial to it is in flight, and its Cut runs before the
// session is tracked. The session, once tracked, sees the state and ends.
func TestDownBeforeTrack(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, func(s tuned) { s.Targets[0].CutOnDown = true })
	var fired atomic.Bool
	setSeam(t, func(at seamPoint, ss *session) error {
		if at != seamTracked || ss.srv != p.srv || fired.Swap(true) {
			return nil
		}
		// Down now; the Cut it brings ran before Track (it saw nothing).
		if !ss.t.B.PassiveFail(1, time.Minute, time.Now()) {
			t.Error("PassiveFail did not mark the backend down")
		}
		return nil
	})
	c := p.dial(t)
	c.Write([]byte("hello"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("client read %d bytes and no end within 10 s: a session on a backend that is down stays", len(n))
	}
	if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != backend.CutDown {
		t.Errorf("access line %v; want end %q", line, backend.CutDown)
	}
	if st := p.svc.Targets[0].B.Stats(); st.CutClosed != 1 {
		t.Errorf("CutClosed = %d; want 1", st.CutClosed)
	}
	p.settle(t, 0)
	p.waitReturns(t)
}

// TestSeamPausesBatch: the seam inside a batch of events holds the loop's
// goroutine there: no event of the loop is dispatched until it lets go
// (what a test forcing a stale entry of a batch needs).
func TestSeamPausesBatch(t *testing.T) {
	testkit.CheckLeaks(t)
	be := testkit.NewServer(t, testkit.Echo)
	p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil, withLoops(1))
	c := p.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	echo := func() error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	}
	if err := echo(); err != nil {
		t.Fatal(err)
	}
	var armed, paused atomic.Bool
	release := make(chan struct{})
	setSeam(t, func(at seamPoint, _ *session) error {
		if at == seamBatch && armed.Load() && !paused.Swap(true) {
			<-release
		}
		return nil
	})
	armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- echo() }() // exits when the echo is back, or the deadline passes
	testkit.WaitFor(t, 10*time.Second, func() error {
		if !paused.Load() {
			return errors.New("the loop never reached the seam")
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("the echo came back (%v) while the loop was paused", err)
	case <-time.After(100 * time.Millisecond): // a negative: the loop must not run meanwhile
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("after the pause: %v", err)
	}
}

// TestCutBeforeTrack (S2 for every cut): a Cut of the backend (a role
// change, a split brain, a primary back, down) runs while a client's
// session to it is dialled and not yet tracked, so it does not see the
// session. The session, once tracked, ends with that Cut's reason; a
// session admitted after the Cut is left alone.
func TestCutBeforeTrack(t *testing.T) {
	for _, why := range []string{backend.CutRoleChange, backend.CutSplitBrain, backend.CutBackup, backend.CutDown} {
		t.Run(why, func(t *testing.T) {
			testkit.CheckLeaks(t)
			be := testkit.NewServer(t, testkit.Echo)
			p := newProxy(t, "rr", []testBackend{{"a", be.Addr, 1}}, nil)
			var fired atomic.Bool
			setSeam(t, func(at seamPoint, ss *session) error {
				if at != seamPicked || ss.srv != p.srv || fired.Swap(true) {
					return nil
				}
				if n := ss.t.B.Cut(why); n != 0 { // as health and reload cut: it sees nothing
					t.Errorf("Cut closed %d sessions; want none tracked yet", n)
				}
				return nil
			})
			c := p.dial(t)
			c.Write([]byte("hello"))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("client read %d bytes and no end within 10 s: a session its backend's Cut missed stays", len(n))
			}
			if line := p.logs.Wait(t, 10*time.Second, "access", isAccess); line["end"] != why {
				t.Errorf("access line %v; want end %q", line, why)
			}
			if st := p.svc.Targets[0].B.Stats(); st.CutClosed != 1 {
				t.Errorf("CutClosed = %d; want 1", st.CutClosed)
			}
			// Admitted after the Cut: served.
			c2 := p.dial(t)
			c2.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c2.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c2, make([]byte, 1)); err != nil {
				t.Fatalf("a session admitted after the Cut: %v; want served", err)
			}
			c2.Close()
			p.settle(t, 0)
			p.waitReturns(t)
		})
	}
}
