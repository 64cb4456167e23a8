package listener

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fulcrum/internal/testkit"
)

// TestPipesInBudget (C5): under a low RLIMIT_NOFILE (256: a limit of 64
// connections), 62 connections stream into a backend that does not read,
// so each of their upload directions holds a pipe (or its buffer) behind
// the full backend. The two clients that come next, under the limit, must
// be served, not accepted and closed for want of a descriptor for their
// dial: the pipes stay within their share of the reserve.
//
// The proxy runs in a child process (this test binary again), whose
// descriptor table is the one lowered; the backend and the clients, with
// their own descriptors, stay in this one.
func TestPipesInBudget(t *testing.T) {
	if addr := os.Getenv("FULCRUM_TEST_BUDGET_BACKEND"); addr != "" {
		budgetChild(t, addr)
		return
	}
	const bulk, ping = 62, 2
	hold := make(chan struct{})
	be := testkit.NewServer(t, func(c *net.TCPConn) {
		tag := make([]byte, 4)
		if _, err := io.ReadFull(c, tag); err != nil {
			return
		}
		if string(tag) == "BULK" {
			<-hold // reads nothing more until the test ends
			return
		}
		c.Write(tag)
		io.Copy(io.Discard, c)
	})
	t.Cleanup(func() { close(hold) }) // before the backend's Close, which waits for its handlers
	cmd := exec.Command(os.Args[0], "-test.run=^TestPipesInBudget$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FULCRUM_TEST_BUDGET_BACKEND="+be.Addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	addrc := make(chan string, 1)
	outDone := make(chan struct{})
	go func() { // exits when the child closes its stdout
		defer close(outDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "PROXY "); ok {
				addrc <- a
				continue
			}
			out.WriteString(sc.Text() + "\n")
		}
	}()
	exited := false
	defer func() {
		if !exited {
			stdin.Close()
			cmd.Wait()
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-time.After(30 * time.Second):
		t.Fatal("the child proxy did not start within 30 s")
	}

	var wg sync.WaitGroup
	blocked := make(chan bool, bulk)
	for range bulk {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		wg.Add(1)
		go func() { // exits when its writes block for a second, or fail
			defer wg.Done()
			buf := make([]byte, 256<<10)
			copy(buf, "BULK")
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write(buf); err != nil {
					blocked <- os.IsTimeout(err)
					return
				}
				buf = buf[:cap(buf)]
				clear(buf[:4])
			}
			blocked <- false
		}()
	}
	wg.Wait()
	for range bulk {
		if !<-blocked {
			t.Fatal("a bulk client's writes failed or never blocked")
		}
	}
	fds, pipes := procFDs(cmd.Process.Pid)
	t.Logf("child with %d bulk connections blocked: %d descriptors, %d of them pipe ends", bulk, fds, pipes)
	for i := range ping {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, 4)
		if _, err := c.Write([]byte("PING")); err != nil {
			t.Errorf("client %d under the limit: write: %v", i, err)
		} else if _, err := io.ReadFull(c, got); err != nil || string(got) != "PING" {
			t.Errorf("client %d under the limit: read %q, %v; want PING: accepted and closed", i, got, err)
		}
	}
	stdin.Close()
	err = cmd.Wait()
	exited = true
	<-outDone
	if err != nil {
		t.Errorf("child: %v\n%s%s", err, out.String(), stderr.String())
	}
}

// budgetChild is TestPipesInBudget's proxy, in the child: descriptors
// lowered to 256, one service over backend addr, until stdin closes.
func budgetChild(t *testing.T, addr string) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = 256
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, "rr", []testBackend{{"a", addr, 1}}, nil)
	if p.srv.MaxConns() != 64 {
		t.Fatalf("MaxConns = %d at 256 descriptors; want 64", p.srv.MaxConns())
	}
	os.Stdout.WriteString("PROXY " + p.addr + "\n")
	io.Copy(io.Discard, os.Stdin)
	fds, pipes := procFDs(os.Getpid())
	t.Logf("at the end: %d descriptors, %d pipe ends, %d pipes open in the pool", fds, pipes, p.srv.pipes.open.Load())
	for _, l := range p.logs.All(func(m map[string]any) bool { return m["message"] == "connect failed" || m["end"] == endConnect }) {
		t.Errorf("%v", l)
	}
}

// procFDs counts process pid's open descriptors, and its pipe ends.
func procFDs(pid int) (fds, pipes int) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, _ := os.Readlink(dir + e.Name()); strings.HasPrefix(l, "pipe:") {
			pipes++
		}
	}
	return len(ents), pipes
}
