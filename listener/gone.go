package listener

// A client that leaves while its connection waits (queue_timeout,
// hold_timeout) is noticed before a backend is dialled for it, and while
// it waits, so that it neither costs a backend a login for nobody nor
// keeps the service slot a live client could have. Only a connection that
// waited pays for the look (one poll); the common path never does.

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/sockfd"
)

// goneEvery is how often a waiting connection looks whether its client is
// still there: the longest a departed client keeps its slot.
const goneEvery = 250 * time.Millisecond

// errClientGone: the client left (FIN or reset) while its connection
// waited, before any backend was dialled for it.
var errClientGone = errors.New("the client left while waiting for a backend")

// clientGone reports whether the client of socket fd has left: it sent FIN
// (RDHUP) or reset the connection (HUP, ERR). One poll with no wait. A
// client that only half-closed while waiting looks the same and is taken
// as gone, as HAProxy's abortonclose does: a waiting client has been sent
// nothing yet, so a FIN from it is almost always a client giving up.
func clientGone(fd int) bool {
	return sockfd.Poll(fd, unix.POLLRDHUP)&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
}

// waitWatching calls wait with deadlines at most goneEvery apart until it
// reports true (woken) or deadline passes, looking between the slices
// whether the client of fd left. wait must be one that may be called again
// after it timed out (hold.wait, place.wait).
func waitWatching(fd int, deadline time.Time, wait func(time.Time) bool) (woken, gone bool) {
	for {
		d := time.Now().Add(goneEvery)
		if d.After(deadline) {
			d = deadline
		}
		if wait(d) {
			return true, false
		}
		if clientGone(fd) {
			return false, true
		}
		if !time.Now().Before(deadline) {
			return false, false
		}
	}
}
