package reload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A directory watcher on inotify, through x/sys/unix. It exists because
// fsnotify (v1.10) does not export IN_CLOSE_WRITE: a file written in place
// must be read when its writer closes it, never at a Write event mid-write.

// dirEvents are what a directory watch reports: a file in it created,
// written, closed after writing, deleted or moved, and the directory itself
// deleted or moved.
const dirEvents = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// errOverflow: the kernel's event queue overflowed, and events were lost.
var errOverflow = errors.New("inotify event queue overflowed; events were lost")

// event is one inotify event: Name is the watched directory joined with the
// file's name, or the directory itself for events about it.
type event struct {
	Name   string
	Mask   uint32 // unix.IN_*
	synced bool   // Sync's marker: every event queued before it came first
}

func (e event) has(mask uint32) bool { return e.Mask&mask != 0 }

// watcher watches directories. Its reading goroutine sends on Events and
// Errors until Close.
type watcher struct {
	Events chan event
	Errors chan error

	fd   int
	f    *os.File      // fd in Go's poller, so that Close unblocks the read
	done chan struct{} // closed by Close
	exit chan struct{} // closed when the reading goroutine has returned

	syncing atomic.Bool // a Sync waits for its marker

	mu   sync.Mutex     // protects dirs and wds
	dirs map[int]string // watch descriptor → directory
	wds  map[string]int // directory → watch descriptor
}

// newWatcher makes the watcher Run uses unless Manager.newWatcher is set
// (a test does, to create it under a lowered fs.inotify.max_queued_events).
func newWatcher() (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &watcher{Events: make(chan event), Errors: make(chan error), fd: fd,
		f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), exit: make(chan struct{}),
		dirs: map[int]string{}, wds: map[string]int{}}
	go w.read() // exits when Close closes f
	return w, nil
}

// Add watches dir (again, if it was watched as another directory with the
// same path).
func (w *watcher) Add(dir string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, dirEvents)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.wds[dir]; ok && old != wd {
		delete(w.dirs, old)
	}
	w.dirs[wd], w.wds[dir] = dir, wd
	return nil
}

// Remove stops watching dir; a watch the kernel has dropped already (its
// directory is gone) is no error.
func (w *watcher) Remove(dir string) {
	w.mu.Lock()
	wd, ok := w.wds[dir]
	delete(w.wds, dir)
	delete(w.dirs, wd)
	w.mu.Unlock()
	if ok {
		unix.InotifyRmWatch(w.fd, uint32(wd)) // EINVAL when the kernel dropped it already
	}
}

// Close stops the watcher and waits for its goroutine.
func (w *watcher) Close() error {
	close(w.done)
	err := w.f.Close()
	<-w.exit
	return err
}

// Sync returns once every event the kernel queued before it was called
// has been handed to handle (and every error to handleErr), in order;
// those that arrive meanwhile are handed on too. Only the goroutine that
// receives Events and Errors may call it.
func (w *watcher) Sync(handle func(event), handleErr func(error)) {
	w.syncing.Store(true)
	w.f.SetReadDeadline(time.Now()) // out of a waiting Read, or none for the next one
	for {
		select {
		case ev := <-w.Events:
			if ev.synced {
				return
			}
			handle(ev)
		case err := <-w.Errors:
			handleErr(err)
		case <-w.done:
			return
		}
	}
}

// read turns what the kernel reports into events until Close.
func (w *watcher) read() {
	defer close(w.exit)
	var buf [64 << 10]byte
	for {
		n, err := w.f.Read(buf[:])
		switch {
		case err == nil:
			if !w.deliver(buf[:n]) {
				return
			}
		case errors.Is(err, os.ErrDeadlineExceeded) && w.syncing.Swap(false):
			w.f.SetReadDeadline(time.Time{}) // before the marker: a later Sync sets it again
			for {                            // what the kernel holds now, without waiting
				n, err := unix.Read(w.fd, buf[:])
				if err != nil || n <= 0 {
					break
				}
				if !w.deliver(buf[:n]) {
					return
				}
			}
			if !w.send(event{synced: true}) {
				return
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.f.SetReadDeadline(time.Time{})
		case errors.Is(err, os.ErrClosed):
			return
		default:
			if !w.sendErr(err) {
				return
			}
		}
	}
}

// deliver sends the events in b, a whole number of them; false when the
// watcher is closing.
func (w *watcher) deliver(b []byte) bool {
	for off := 0; off+unix.SizeofInotifyEvent <= len(b); {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[off]))
		name := b[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
		off += unix.SizeofInotifyEvent + int(raw.Len)
		if raw.Mask&unix.IN_Q_OVERFLOW != 0 {
			if !w.sendErr(errOverflow) {
				return false
			}
			continue
		}
		w.mu.Lock()
		dir, ok := w.dirs[int(raw.Wd)]
		if raw.Mask&unix.IN_IGNORED != 0 && ok { // the kernel dropped the watch: its directory is gone
			delete(w.dirs, int(raw.Wd))
			if w.wds[dir] == int(raw.Wd) {
				delete(w.wds, dir)
			}
		}
		w.mu.Unlock()
		if !ok {
			continue // a watch removed since
		}
		ev := event{Name: dir, Mask: raw.Mask}
		if i := indexNUL(name); i > 0 {
			ev.Name = filepath.Join(dir, string(name[:i]))
		}
		if !w.send(ev) {
			return false
		}
	}
	return true
}

func (w *watcher) send(ev event) bool {
	select {
	case w.Events <- ev:
		return true
	case <-w.done:
		return false
	}
}

func (w *watcher) sendErr(err error) bool {
	select {
	case w.Errors <- err:
		return true
	case <-w.done:
		return false
	}
}

// indexNUL returns the length of the NUL-padded name in b.
func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}
