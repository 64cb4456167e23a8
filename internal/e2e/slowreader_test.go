package e2e

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// rss is process pid's resident set size in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// pattern is an endless stream of a random block of a prime length, so
// that bytes lost, repeated or reordered in 64 KiB pieces change the
// stream's checksum.
type pattern struct{ off int }

var patternBlock = func() []byte {
	b := make([]byte, 65521)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

func newPattern() io.Reader { return &pattern{} }

func (p *pattern) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		c := copy(b[n:], patternBlock[p.off:])
		n += c
		p.off = (p.off + c) % len(patternBlock)
	}
	return n, nil
}

// counter is an io.Writer that counts, for a stream's progress.
type counter struct{ n atomic.Int64 }

func (c *counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// stalled waits until n stops moving for quiet, within limit.
func stalled(t *testing.T, n *atomic.Int64, quiet, limit time.Duration) int64 {
	t.Helper()
	last, since := n.Load(), time.Now()
	testkit.WaitFor(t, limit, func() error {
		if v := n.Load(); v != last {
			last, since = v, time.Now()
		}
		if time.Since(since) < quiet {
			return fmt.Errorf("the stream has not stalled for %v (%d bytes)", quiet, last)
		}
		return nil
	})
	return last
}

// TestSlowReaderMemory: a client that stops reading while its backend
// streams 1 GiB (and, the other way, a backend that stops reading while its
// client streams 1 GiB) costs the daemon no more memory than twice a
// direction's buffer and pipe: it stops reading the fast side instead of
// buffering. When the reader resumes, every byte arrives, in order.
func TestSlowReaderMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 2 GiB through a freshly built daemon")
	}
	plain, err := plainBinary()
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	const allowance = 2 * (16<<10 + 1<<20) // a direction's buffer and pipe, twice
	for _, dir := range []string{"backend to client", "client to backend"} {
		t.Run(strings.ReplaceAll(dir, " ", "_"), func(t *testing.T) {
			// The backend either streams size bytes, or reads them once told to.
			resume := make(chan struct{})
			var sent counter
			got := make(chan [32]byte, 1)
			be := testkit.NewServer(t, func(c *net.TCPConn) {
				c.Write([]byte("hi\n"))
				if dir == "backend to client" {
					io.Copy(io.MultiWriter(c, &sent), io.LimitReader(newPattern(), size))
					c.CloseWrite()
					return
				}
				<-resume
				h := sha256.New()
				io.Copy(h, c)
				got <- [32]byte(h.Sum(nil))
			}).Addr
			cfg := writeFile(t, "fulcrum.toml", fmt.Sprintf("[log]\nformat = \"json\"\n[services.s]\nlisten = [\"127.0.0.1:0\"]\nbackends = [{ address = %q }]\n", be))
			d := startDaemonArgs(t, []string{"-c", fmt.Sprintf("exec %s -config %s", plain, cfg)}, nil, nil)
			addr := d.listenAddr(t)
			pid := d.cmd.Process.Pid

			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if line, err := br.ReadString('\n'); err != nil || line != "hi\n" {
				t.Fatalf("greeting %q, %v", line, err)
			}
			before := rss(t, pid)

			want := sha256.New()
			io.Copy(want, io.LimitReader(newPattern(), size))
			var stall int64
			if dir == "backend to client" {
				stall = stalled(t, &sent.n, time.Second, 60*time.Second)
			} else {
				done := make(chan error, 1)
				go func() { // exits when size bytes are written or the connection fails
					_, err := io.Copy(io.MultiWriter(c, &sent), io.LimitReader(newPattern(), size))
					c.(*net.TCPConn).CloseWrite()
					done <- err
				}()
				stall = stalled(t, &sent.n, time.Second, 60*time.Second)
				defer func() {
					if err := <-done; err != nil {
						t.Errorf("client write: %v", err)
					}
				}()
			}
			after := rss(t, pid)
			t.Logf("stalled after %d MiB; daemon RSS %d KiB → %d KiB", stall>>20, before>>10, after>>10)
			if after-before > allowance {
				t.Errorf("daemon RSS grew by %d KiB while the reader stalled; want at most %d KiB", (after-before)>>10, allowance>>10)
			}

			c.SetDeadline(time.Now().Add(120 * time.Second))
			if dir == "backend to client" {
				h := sha256.New()
				n, err := io.Copy(h, br)
				if err != nil || n != size || [32]byte(h.Sum(nil)) != [32]byte(want.Sum(nil)) {
					t.Fatalf("after resuming: %d bytes, %v; want %d bytes with the sent checksum", n, err, size)
				}
				return
			}
			close(resume)
			select {
			case sum := <-got:
				if sum != [32]byte(want.Sum(nil)) {
					t.Fatal("the backend received other bytes than the client sent")
				}
			case <-time.After(120 * time.Second):
				t.Fatal("the backend did not receive the whole stream within 120 s")
			}
		})
	}
}
