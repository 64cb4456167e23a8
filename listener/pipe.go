package listener

import (
	"sync"
	"sync/atomic"
	"time"

	"fulcrum/internal/sockfd"
)

// pipe is a kernel pipe that one direction of a session splices through:
// socket → pipe (fill), then pipe → socket (flush).
type pipe struct {
	r, w int // read and write ends, both O_NONBLOCK and O_CLOEXEC
	n    int // bytes spliced in and not yet out: 0 whenever the pipe is in a pool
}

func (p *pipe) close() {
	sockfd.Close(p.r)
	sockfd.Close(p.w)
}

// pipePool lends pipes to directions that are moving data, so that an idle
// connection holds none (HAProxy's maxpipes, roughly): a direction takes a
// pipe when it starts a splice and gives it back when the pipe is empty
// again and its source has nothing more to read. A pipe that may still hold
// bytes is closed, never pooled.
//
// The pool belongs to a Server; Server.Wait closes the pipes it keeps.
type pipePool struct {
	size  int   // capacity asked for with F_SETPIPE_SZ; 0 = the kernel's default
	least int   // when F_SETPIPE_SZ fails, the capacity below which a pipe is not used; 0 = any
	max   int   // empty pipes kept for reuse; more are closed
	limit int64 // pipes open at once, lent or kept (limit.go); 0 = no limit

	mu   sync.Mutex // protects idle
	idle []*pipe

	open     atomic.Int64  // pipes open now: lent out or idle
	lent     atomic.Uint64 // pipes lent so far
	failedAt atomic.Int64  // mono() of the last pipe2 failure, 0 = none
}

// newPipePool is a Server's pool: pipes of pipeSize, at most limit open.
func newPipePool(limit int) pipePool {
	return pipePool{size: pipeSize, least: pipeLeast, max: min(pipesKept, limit), limit: int64(limit)}
}

// pipeLeast is the smallest pipe worth splicing through: the kernel's
// default (16 pages). Over fs.pipe-user-pages-soft (an unprivileged user,
// as under DynamicUser=, whose pipes add up to 64 MiB) a new pipe gets two
// pages and F_SETPIPE_SZ fails; a splice through it moves at most 8 KiB,
// half of what the buffer copies per syscall, so the buffer does better.
const pipeLeast = 64 << 10

// pipeRetry is how long the pool refuses to try pipe2 again after it failed
// (EMFILE, ENFILE): meanwhile directions copy through their buffer.
const pipeRetry = 100 * time.Millisecond

// get lends an empty pipe, or returns nil when none can be had.
func (pp *pipePool) get() *pipe {
	pp.mu.Lock()
	if n := len(pp.idle); n > 0 {
		p := pp.idle[n-1]
		pp.idle[n-1] = nil
		pp.idle = pp.idle[:n-1]
		pp.mu.Unlock()
		pp.lent.Add(1)
		return p
	}
	pp.mu.Unlock()
	if t := pp.failedAt.Load(); t != 0 && mono()-t < int64(pipeRetry) {
		return nil
	}
	if n := pp.open.Add(1); pp.limit > 0 && n > pp.limit { // the pipes' share of the descriptors is used up
		pp.open.Add(-1)
		return nil
	}
	r, w, err := sockfd.Pipe()
	if err != nil {
		pp.open.Add(-1)
		pp.failedAt.Store(mono())
		return nil
	}
	if pp.size > 0 {
		// F_SETPIPE_SZ fails above fs.pipe-max-size, which leaves the pipe
		// at its default size, which still works; and once an unprivileged
		// user's pipes add up to fs.pipe-user-pages-soft, which leaves it
		// at two pages (pipeLeast): then the buffer, and pipe2 again after
		// pipeRetry.
		if sz, err := sockfd.SetPipeSize(r, pp.size); pp.least > 0 && (err != nil || sz < pp.least) {
			sockfd.Close(r)
			sockfd.Close(w)
			pp.open.Add(-1)
			pp.failedAt.Store(mono())
			return nil
		}
	}
	pp.lent.Add(1)
	return &pipe{r: r, w: w}
}

// put takes back a pipe lent by get: pooled if empty and there is room,
// else closed.
func (pp *pipePool) put(p *pipe) {
	if p.n == 0 {
		pp.mu.Lock()
		if len(pp.idle) < pp.max {
			pp.idle = append(pp.idle, p)
			pp.mu.Unlock()
			return
		}
		pp.mu.Unlock()
	}
	pp.open.Add(-1)
	p.close()
}

// closeIdle closes every pooled pipe; pipes lent out are closed when given back.
func (pp *pipePool) closeIdle() {
	pp.mu.Lock()
	idle := pp.idle
	pp.idle = nil
	pp.mu.Unlock()
	for _, p := range idle {
		pp.open.Add(-1)
		p.close()
	}
}

// idleCount is the number of pooled pipes.
func (pp *pipePool) idleCount() int {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return len(pp.idle)
}
