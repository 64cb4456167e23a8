package logsink

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestNeverBlocks: with the output a pipe that nobody reads, every Write
// returns at once; what does not fit is dropped and counted, and once the
// pipe is read again the queued lines come out, followed by OnDrop's line
// saying how many were lost.
func TestNeverBlocks(t *testing.T) {
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := New(pw, 64<<10)
	var reported atomic.Uint64
	w.OnDrop = func(n uint64) {
		reported.Add(n)
		fmt.Fprintf(w, "dropped %d\n", n)
	}
	const lines = 20000 // 2 MB: many times the pipe's 64 KiB and the buffer's 64 KiB
	wrote := make(chan time.Duration, 1)
	go func() { // exits after the writes, which never block
		start := time.Now()
		for i := range lines {
			fmt.Fprintf(w, "line %05d %s\n", i, strings.Repeat("x", 90))
		}
		wrote <- time.Since(start)
	}()
	select {
	case d := <-wrote:
		t.Logf("%d lines written in %v", lines, d)
	case <-time.After(20 * time.Second):
		t.Fatal("writes blocked on a pipe nobody reads")
	}
	if !w.Stalled() || w.Dropped() == 0 {
		t.Fatalf("Stalled = %v, Dropped = %d; want lines dropped while the pipe is full", w.Stalled(), w.Dropped())
	}
	dropped := w.Dropped()

	// The reader comes back: every line is either written out, in order, or
	// counted in a drop line written after it.
	sc := bufio.NewScanner(r)
	got, last := 0, -1
	var said uint64
	for uint64(got)+said < lines && sc.Scan() {
		l := sc.Text()
		var n uint64
		if _, err := fmt.Sscanf(l, "dropped %d", &n); err == nil {
			said += n
			continue
		}
		var i int
		if _, err := fmt.Sscanf(l, "line %d", &i); err != nil || i <= last {
			t.Fatalf("line %q after line %d: want the lines in order", l, last)
		}
		got, last = got+1, i
	}
	if said != dropped || uint64(got)+dropped != lines {
		t.Errorf("%d lines written out, drop lines say %d, Dropped %d; want %d in all", got, said, dropped, lines)
	}
	if reported.Load() != dropped || w.Stalled() {
		t.Errorf("OnDrop reported %d, Stalled = %v; want %d and false", reported.Load(), w.Stalled(), dropped)
	}
	// Back to normal: a new line goes straight through.
	fmt.Fprintln(w, "after")
	if !sc.Scan() || sc.Text() != "after" {
		t.Errorf("next line %q; want \"after\"", sc.Text())
	}
	if !w.Close(5*time.Second) || w.Dropped() != dropped {
		t.Errorf("Close did not flush, or dropped more (%d)", w.Dropped())
	}
	pw.Close()
}

// TestCloseBounded: Close on a stuck output returns after its timeout.
func TestCloseBounded(t *testing.T) {
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer pw.Close()
	w := New(pw, 1<<20)
	for range 2000 {
		fmt.Fprintf(w, "%s\n", strings.Repeat("y", 200)) // 400 KB: more than the pipe takes
	}
	start := time.Now()
	if w.Close(200 * time.Millisecond) {
		t.Error("Close = true on a pipe nobody reads; want false")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	go func() { // lets the Writer's goroutine end, so that the test leaves none
		bufio.NewReader(r).WriteTo(devNull{})
	}()
	<-w.done
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkWrite: what a log line costs its writer, the output a file.
//
//	go test -run '^$' -bench . -benchmem ./logsink/
func BenchmarkWrite(b *testing.B) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	line := []byte(`{"level":"info","component":"listener","service":"pg","client":"10.0.0.7:51234","backend":"pg-b","backend_addr":"10.0.1.12:5432","queue_ms":0.012,"connect_ms":0.41,"retries":1,"bytes_in":1832,"bytes_out":90211,"duration_ms":5123.8,"end":"client close","message":"connection"}` + "\n")
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			f.Write(line)
		}
	})
	b.Run("logsink", func(b *testing.B) {
		w := New(f, 0)
		for b.Loop() {
			w.Write(line)
		}
		w.Close(5 * time.Second)
		b.ReportMetric(float64(w.Dropped()), "dropped")
	})
}
