package testkit

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// StartProxyFront starts HAProxy (mode tcp) on a free loopback port in
// front of addr, accepting only connections that begin with a PROXY
// header (bind … accept-proxy): a PROXY-only front, as a backend that
// requires the header is deployed. It returns the front's address; the
// test's cleanup stops it.
func StartProxyFront(t testing.TB, addr string) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		missing(t, "haproxy")
	}
	front := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	writeFile(t, cfg, fmt.Sprintf(`defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend front
  bind %s accept-proxy
  default_backend back
backend back
  server s %s
`, front, addr))
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // exits with the process
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	WaitFor(t, 20*time.Second, func() error { // a starting server gives no event but its port
		c, err := net.DialTimeout("tcp", front, time.Second)
		if err != nil {
			select {
			case <-done:
				t.Fatalf("haproxy exited: %v", cmd.ProcessState)
			default:
			}
			return fmt.Errorf("haproxy on %s has not started: %w", front, err)
		}
		c.Close()
		return nil
	})
	return front
}
