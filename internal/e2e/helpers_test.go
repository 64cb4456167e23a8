package e2e

// The helpers of every test here: the binary and its commands, files,
// the admin listener as a client sees it, and what a test needs of the
// machine. The daemon as a process is in daemon_helpers_test.go, the
// network-namespace labs in lab_helpers_test.go.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"fulcrum/internal/testkit"
)

// bin is the fulcrum binary TestMain built for every test of the package.
var bin string

// TestMain builds fulcrum once, with the race detector when the tests have
// it, so that the daemon they start is checked as they are.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fulcrum-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "fulcrum")
	if err := build(bin, testkit.RaceEnabled); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if testkit.RaceEnabled {
		// The race runtime sleeps 1 s at exit by default, which every
		// command and every daemon's stop would wait through; a report it
		// makes still fails the process (exit status 66).
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the module's root package to out, with -race if race.
func build(out string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool(), append(args, "fulcrum")...)
	cmd.Dir = "../.." // the module root: go build finds go.mod from here
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// goTool is the go command: the one on PATH, else the one of the
// toolchain that built this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// plainBinary is fulcrum without the race detector, for tests that
// measure the daemon's memory: the race runtime's shadow memory would be
// measured with it. It is bin unless that is a race build.
var plainBinary = sync.OnceValues(func() (string, error) {
	if !testkit.RaceEnabled {
		return bin, nil
	}
	out := bin + "-norace"
	return out, build(out, false)
})

// cli runs a fulcrum command (status, drain, -check…) to its end and
// returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	default:
		fmt.Fprintln(stderr, err)
		return -1
	}
}

// The messages of the instance's drain state.
const (
	logDraining  = "instance draining: /healthz fails, connections are still served"
	logUndrained = "instance undrained: /healthz follows the backends again"
	logStopping  = "instance stopping: /healthz fails until exit"
)

// writeFile writes text to a file called name in a new temporary
// directory and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// replaceFile writes data next to path and renames it over path, as
// consul-template's atomic write does.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fulcrum.toml.*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// client is for the admin listener: bounded, as fulcrum's own commands are.
var client = http.Client{Timeout: 10 * time.Second}

// get fetches http://addr+path and returns the status code and body.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// greet connects through the balancer and returns the backend's greeting.
func greet(t *testing.T, lb string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", lb, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("greeting: %v", err)
	}
	return strings.TrimSpace(line)
}

// needProgram returns the path of a program, skipping the test where it is
// missing outside CI (.ci/run installs it).
func needProgram(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skipUnlessCI(t, name+" is not installed (.ci/run installs it)")
	}
	return p
}

// skipUnlessCI skips the test for why, except in CI (CI=true), where what
// is missing is a broken CI machine: there it fails.
func skipUnlessCI(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI must run this test", why)
	}
	t.Skip(why)
}
