// Package logsink is the daemon's way out for log lines: a bounded buffer
// in front of stderr that never makes a caller wait.
//
// The log is written by whoever has something to say: a connection's
// access line as it ends, a health transition, a reload. When stderr is a
// pipe nobody reads (journald stalled, a log shipper stuck), a direct write
// blocks, and with it whatever the writer held: a finished connection its
// place under the connection limit, the accept loop, the reload loop. A
// Writer copies each line into a buffer of at most Size bytes and returns;
// one goroutine of its own writes the buffer out. A line that does not fit
// is dropped and counted (Dropped, fulcrum_log_dropped_total). Once a
// write succeeds again after drops, OnDrop is called with how many were
// lost, so that the log itself says so.
//
// Typical use (main does this):
//
//	sink := logsink.New(os.Stderr, logsink.DefaultSize)
//	defer sink.Close(2 * time.Second)
//	log := zerolog.New(sink)
//	sink.OnDrop = func(n uint64) { log.Warn().Uint64("dropped", n).Msg("…") }
package logsink

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSize is the buffer's default bound: some 3,500 access lines, a
// burst's worth at any rate the daemon serves while its goroutine waits
// for a turn; a reader gone for longer loses lines rather than the daemon
// its memory.
const DefaultSize = 1 << 20

// Writer is an io.Writer that queues each Write (one log line: zerolog
// writes each event with one call) and never blocks on the output.
type Writer struct {
	// OnDrop, if set before the first Write, is called on the Writer's
	// goroutine after the output took a write again following drops, with
	// the number dropped since the last call. It may log through the
	// Writer.
	OnDrop func(n uint64)

	out  io.Writer
	size int

	mu      sync.Mutex // protects buf, pending and closed
	buf     []byte     // lines not yet written, whole, oldest first
	pending uint64     // dropped since OnDrop was last called
	closed  bool

	dropped atomic.Uint64 // every line dropped
	stalled atomic.Bool   // a line was dropped and the output has not taken a write since
	wake    chan struct{} // a line was queued, or Close; buffered 1
	done    chan struct{} // closed when the goroutine has exited
}

// New starts a Writer in front of out holding at most size bytes of lines
// (DefaultSize if size <= 0). Its goroutine runs until Close.
func New(out io.Writer, size int) *Writer {
	if size <= 0 {
		size = DefaultSize
	}
	w := &Writer{out: out, size: size, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run() // exits at Close, once the queue is written
	return w
}

// Write queues a copy of p, or drops it when the buffer cannot take it. It
// always reports success: a log line is never worth an error to its caller.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || len(w.buf)+len(p) > w.size {
		w.pending++
		w.mu.Unlock()
		w.dropped.Add(1)
		w.stalled.Store(true)
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
	return len(p), nil
}

// Dropped returns how many lines were dropped since New.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Stalled reports whether lines are being dropped now: one was, and the
// output has not taken a write since.
func (w *Writer) Stalled() bool { return w.stalled.Load() }

// run writes the queue out until Close, then what is left. Two buffers
// take turns: Write fills one while run writes the other out in one call,
// so that a busy log costs one write(2) per batch and no allocation per
// line.
func (w *Writer) run() {
	defer close(w.done)
	var out []byte
	for {
		<-w.wake
		for {
			w.mu.Lock()
			out, w.buf = w.buf, out[:0]
			closed := w.closed
			w.mu.Unlock()
			if len(out) == 0 {
				if closed {
					return
				}
				break
			}
			w.out.Write(out) // blocks while nobody reads: only this goroutine waits
			w.stalled.Store(false)
			w.mu.Lock()
			n := w.pending
			w.pending = 0
			w.mu.Unlock()
			if n > 0 && w.OnDrop != nil {
				w.OnDrop(n) // queues its own line, written on the next round
			}
		}
	}
}

// Close stops taking lines and waits up to timeout for those queued to be
// written; it reports whether they all were. Lines written after Close are
// dropped. It does not close the output.
func (w *Writer) Close(timeout time.Duration) bool {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return false // the output is stuck; the goroutine ends with the process
	}
}
