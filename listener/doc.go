package listener

// The data path's invariants, in one place, each with the tests that hold
// it. The package comment is in server.go; the event loop's own rules (the
// direction state machine, lost wakeups) are at the top of loop.go.
//
// Descriptors
//
//   - A session's two descriptors are closed once, by finish, and only
//     after both table entries are cleared (forget): a number the kernel
//     gives again never maps to the old session. finish runs when live, the
//     session's count of owners, reaches zero. The owners are admission
//     (from newSession until begin has registered both sockets, or failed
//     to), each half while it runs, and each stop while it shuts the sockets
//     down. Nothing else closes a session's descriptor, and no error path
//     calls finish directly. [TestBeginReset, TestBeginUpload,
//     TestBeginRegisterFails (seam); TestCutDuringChurn]
//   - begin owns both halves (stRunning) from before the first registration
//     until both are in: an event between the two only marks a half kicked,
//     and begin runs it afterwards. [TestBeginReset, TestBeginUpload (seam)]
//   - A pipe that may hold bytes is closed, never pooled; every pipe is in
//     the pool's count (open), which stays within pipeLimit, half the
//     descriptor reserve, so that pipes never take the descriptors a
//     connection under the limit needs. [TestPipePool, TestPipesInBudget]
//
// Ends
//
//   - stop can always end a session whose descriptors are owned: before
//     begin (admission's count keeps live above zero), during it, and after.
//     A session tracked by its backend can be ended by Cut and by a drain
//     deadline from the moment Track returns. [TestCutBeforeBegin (seam),
//     TestCutDuringChurn]
//   - A session tracked after its backend went down with on_down = "close"
//     is cut by itself: Track and Cut share the backend's lock, and the
//     state is set before the Cut runs. [TestDownBeforeTrack (seam)]
//   - So is a session tracked after any Cut of its backend (role change,
//     split brain, primary back, down) that ran after the table it was
//     admitted on was loaded (backend.TrackSince: the Cut's time and
//     reason are kept under the same lock), with that Cut's reason.
//     [TestCutBeforeTrack (seam)]
//   - Every connection accepted gives back its slot, its lease and its
//     count of the Server's WaitGroup once, and logs one access line.
//     [the seam tests' settle and access-line counts; TestCutDuringChurn]
//   - A clean EOF is passed on as a FIN and the other direction goes on; an
//     error on either side shuts both sockets down and the session ends as
//     reset (design.md: nginx's stream proxy does the same; bytes a
//     direction still holds are not delivered after its peer's reset, since
//     closing a socket with unread bytes resets it, and a reset purges what
//     is not yet sent). [TestHalfClose, copy_test.go's reset cases]
//
// Bytes
//
//   - Every byte read is written, in order, once: short writes and short
//     splices loop until EAGAIN, and a direction that would block holds its
//     bytes until EPOLLOUT. [TestBulkBothWays, copy_test.go]
//   - A short read is trusted to have emptied the socket only if no event
//     with RDHUP, HUP, ERR or PRI came since a read last found it empty; a
//     stale one (an earlier use of the number) costs reads until then.
//     [TestHalfClose, TestUrgentData, TestStaleHupForgotten]
//   - Urgent data (MSG_OOB) never stalls a direction or ends it early:
//     splice never passes the urgent mark, so its 0 is confirmed by a read,
//     and its EAGAIN after PRI is too. Sockets have SO_OOBINLINE where they
//     take it, and the urgent byte is then an ordinary byte of the stream.
//     [TestUrgentData]
//
// Waits
//
//   - A connect is taken as done only when the socket says so (writable):
//     a wake-up for an earlier use of its number waits again, to the same
//     deadline. [TestStaleEventDoesNotCompleteConnect]
//   - A direction runs inline in its loop for at most runBudget bytes per
//     kick, then in a goroutine of its own. [BenchmarkEchoBesideBulk]
//
// The seam
//
// The races that are one syscall wide in production are forced through a
// test-only seam (seam.go): seamAt, at named points (seamRegistered,
// seamTracked, seamBatch, seamPicked), calls a hook a test sets, in a build with the
// tag fulcrumseam; in the release build seamAt is an empty function the
// compiler removes. The seam tests are in seam_test.go:
//
//	go test -race -tags fulcrumseam ./listener/
