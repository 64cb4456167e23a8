package listener

// The test-only seam: points in the data path where a test built with the
// tag fulcrumseam can pause a goroutine (or make a step fail), so that a
// race that is one syscall wide in production is forced deterministically
// (seam_on.go). In the release build seamAt is an empty function
// (seam_off.go) that the compiler inlines away: the binary has no call, no
// load and no branch for it.

// seamPoint names a point of the data path.
type seamPoint uint8

const (
	// seamRegistered: begin has registered the client socket, and not yet
	// the backend socket; the client's events may be dispatched meanwhile.
	// An error from the hook is taken as register(backend)'s.
	seamRegistered seamPoint = iota + 1
	// seamTracked: handle has tracked the session with its backend (Cut and
	// a drain deadline reach it from now on), and not yet begun it.
	seamTracked
	// seamBatch: the loop is inside a batch of events, after dispatching
	// one of them (ss is the session it concerned, or nil).
	seamBatch
	// seamPicked: handle has dialled the session's backend and made the
	// session, and not yet tracked it: a Cut of the backend now does not
	// see it.
	seamPicked
	// seamLoopAccept: a loop that owns a listening socket is about to
	// accept from it (drainIn). An error from the hook is taken as
	// accept4's.
	seamLoopAccept
	// seamAcceptEmpty: a loop found a listening socket's queue empty and
	// has not yet parked it.
	seamAcceptEmpty
	// seamAcceptWaitOwner: a retired socket's accept goroutine found it
	// owned by a loop, and is about to wait for the loop to hand it over
	// (endSocket).
	seamAcceptWaitOwner
)
