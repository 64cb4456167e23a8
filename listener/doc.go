package listener

// One connection, file by file: the walk a newcomer can follow from the
// accept to the access line. The package comment is in server.go.
//
//  1. accept   accept.go     the event loop whose epoll a connection wakes
//                            owns the listening socket (kick) and accepts
//                            (drainIn): acceptRaw takes a slot of the
//                            connection limit (limit.go) and accept4s it as
//                            a raw non-blocking descriptor (sockfd.Accept4).
//                            The connection is served inline in the loop's
//                            goroutine until it would wait, then detaches;
//                            the socket's accept goroutine (accept) takes
//                            the limit, errors and the heartbeat.
//  2. admit    admit.go      handle runs the steps; identify: the service
//                            at the address and its Policy (policy.go),
//                            keepalive (keepalive.go), the PROXY header
//                            (proxyproto.go: proxyHeader)
//                            and, on a PostgreSQL address, a CancelRequest
//                            (cancel.go: cancelled). Every wait for a
//                            client's first bytes is one fdPeeker (peek.go);
//                            the bytes are parsed by internal/wire.
//  3. route    routes.go     on an address routed by name (routeIn in
//                            admit.go): route reads the ClientHello or
//                            SSLRequest (hello.go: preread) and
//                            sched.Routes chooses the service.
//  4. screen   admit.go      takeSlots: screen (access lists, accept_rate);
//              lease.go      then the lease takes a source and a service slot
//                            (holdSource, holdService) in the service's
//                            admission state (admission.go), waiting in its
//                            queue if need be. A refusal is a Reject
//                            (reject.go), logged at most once a second.
//  5. pick     connect.go    connect: the service's pool, Pick (sched), the
//                            backend's slot (backend.Acquire); with
//                            hold_timeout, connectHeld waits in the hold
//                            queue (holdqueue.go) for an eligible backend.
//  6. dial     connect.go    dial: a raw non-blocking socket and connect
//                            (sockfd), from the client's address with
//                            source = "client" (transparent.go); a connect
//                            in progress waits in an event loop (await,
//                            loop.go). Then the PROXY header to the backend
//                            (reach, admit.go) or its SSLRequest (toBackend,
//                            routes.go).
//  7. session  session.go    startSession (admit.go): newSession takes the
//                            lease over, its backend tracks it; begin
//                            registers both sockets in one of the Server's
//                            event loops and the connection holds no
//                            goroutine from here on.
//  8. copy     loop.go       the loop's epoll wakes a direction (dispatch,
//              half.go       kick), which runs fill and flush (step) until
//              xfer.go       it would block: read and send through a
//              pipe.go       buffer, or splice through a pooled pipe. The
//                            lost-wakeup rules are at the top of loop.go.
//  9. release  session.go    a direction's end (halfDone) passes a FIN on
//              lease.go      or stops both; the last owner finishes: both
//              access.go     sockets closed, lease.release gives back every
//                            slot, then the access line (access.go).
//
// Beside the walk: export.go (the listening sockets for a binary upgrade),
// server.go (the Server, its listeners and Publish), gone.go (a waiting
// client that leaves), usertimeout.go, every.go, admitting.go, seam*.go.
// Every system call is internal/sockfd's.
//
// The data path's invariants, in one place, each with the tests that hold
// it. The event loop's own rules (the direction state machine, lost
// wakeups) are at the top of loop.go.
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
// Admission
//
//   - A service's admission state (admission.go: its service slots and
//     their queue, the backend queue, the hold queue, the accept_rate
//     bucket, the slots per source, the counters) is the Server's, by
//     service name: Publish adds a service the first time a snapshot
//     names it and sets its accept_rate before the store, and it outlives
//     reloads as the listeners do. [TestApplyRefusedChangesNothing
//     (reload), TestAcceptRate]
//   - A connection's lease holds its source and service slots in that
//     state and its backend's slot; release gives each back once, and a
//     freed backend slot goes to the oldest connection of the backend's
//     service queued for one (one wake per slot; a wake that cannot be
//     used is handed on while the slot is free). A freed service slot goes
//     to the oldest waiter, never to a newcomer. [TestLeaseReleasedOnEveryEnd,
//     TestBackendWakeOne, TestAdmitInArrivalOrder, TestMaxConns]
//   - A held connection (hold_timeout) joins the hold queue before it
//     loads the snapshot, and Publish stores before it wakes the queue: a
//     snapshot published after that load always wakes it, whoever
//     publishes it; so does a passing check (Kick). [TestPublishWakesHeld,
//     TestHoldQueue, TestHold]
//
// Waits
//
//   - A connect is taken as done only when the socket says so (writable):
//     a wake-up for an earlier use of its number waits again, to the same
//     deadline. [TestStaleEventDoesNotCompleteConnect]
//   - A direction runs inline in its loop for at most runBudget bytes per
//     kick, then in a goroutine of its own. [BenchmarkEchoBesideBulk]
//   - A loop waits in epoll_wait holding its P only while it holds a raw
//     slot, of which there are one fewer than GOMAXPROCS (raised to the
//     loops + 1): accepts, checks, timers and other goroutines always have
//     a P. It yields every 9 ms, and after 50 ms without an event waits as
//     a blocking syscall, giving its P back. [TestBusyLoopLeavesAP]
//
// Accepting
//
//   - One owner accepts from a listening socket at a time; an event while
//     it is owned marks it kicked, and the owner that then finds the queue
//     empty accepts again instead of parking. [TestAcceptorStates]
//   - A loop accepts at most acceptBatch connections per wake-up, and the
//     rest after its next wait, with no new edge. [TestLoopAcceptsQueueBeyondBatch]
//   - A loop never waits on an accept: at the limit, and after an accept
//     error, it hands the socket to its accept goroutine, which waits or
//     backs off, and accepts what is queued. [TestLoopAcceptErrorHandedOver,
//     TestConnLimit]
//   - A retired socket's descriptor is closed only once no loop watches it
//     and none owns it: its accept goroutine waits for the owner, which
//     hands it over when it sees the retirement, having parked it or not.
//     [TestRetireWhileLoopParks, TestRetireWhileLoopAccepts]
//
// The seam
//
// The races that are one syscall wide in production are forced through a
// test-only seam (seam.go): seamAt, at named points (seamRegistered,
// seamTracked, seamBatch, seamPicked, and the accept path's seamLoopAccept,
// seamAcceptEmpty, seamAcceptWaitOwner), calls a hook a test sets, in a
// build with the tag fulcrumseam; in the release build seamAt is an empty
// function the compiler removes. The seam tests are in seam_test.go and
// accept_seam_test.go:
//
//	go test -race -tags fulcrumseam ./listener/
