package backend

import "io"

// Holds reports whether a session b tracks satisfies match, which runs
// under b's lock and must not call into b. A PostgreSQL cancel request
// looks with it for the backends holding a session of its client
// (listener's cancel.go). O(sessions): for that rare path only.
func (b *Backend) Holds(match func(io.Closer) bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.sessions {
		if match(s) {
			return true
		}
	}
	return false
}
