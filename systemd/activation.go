package systemd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenFDsStart is SD_LISTEN_FDS_START: passed sockets begin at fd 3.
const listenFDsStart = 3

// Socket is one listening socket passed by systemd socket activation.
type Socket struct {
	Name     string // from LISTEN_FDNAMES (FileDescriptorName=); "" if unnamed
	Listener *net.TCPListener
}

// Listeners returns the TCP listening sockets passed in LISTEN_FDS, named by
// LISTEN_FDNAMES, after checking that LISTEN_PID is this process. It
// returns nil, nil when nothing was passed. Each fd is wrapped with
// net.FileListener (which dups it) and the original is closed, so the
// caller owns exactly the returned listeners. Sockets that are not TCP
// listeners are an error, not silently dropped. Call it once: it unsets the
// LISTEN_* variables so that children do not inherit them.
func (n *Notifier) Listeners() ([]Socket, error) {
	pid := n.getenv("LISTEN_PID")
	if pid == "" {
		return nil, nil
	}
	// A process started by Upgrade finds its parent's pid here (see upgrade.go).
	mine := pid == strconv.Itoa(os.Getpid()) || n.getenv(UpgradeEnv) != "" && pid == strconv.Itoa(os.Getppid())
	if !mine {
		return nil, nil // meant for another process
	}
	count, err := strconv.Atoi(n.getenv("LISTEN_FDS"))
	if err != nil || count < 0 {
		return nil, fmt.Errorf("socket activation: bad LISTEN_FDS %q", n.getenv("LISTEN_FDS"))
	}
	var names []string
	if s := n.getenv("LISTEN_FDNAMES"); s != "" {
		names = strings.Split(s, ":")
	}
	if n == nil || n.Getenv == nil {
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
	}
	out := make([]Socket, 0, count)
	var errs []string
	for i := range count {
		fd := listenFDsStart + i
		unix.CloseOnExec(fd)
		name := ""
		if i < len(names) && names[i] != "unknown" {
			name = names[i]
		}
		f := os.NewFile(uintptr(fd), "listen-fd-"+strconv.Itoa(fd))
		ln, err := net.FileListener(f)
		f.Close() // FileListener dup'd it
		if err != nil {
			errs = append(errs, fmt.Sprintf("fd %d (%q): %v", fd, name, err))
			continue
		}
		tl, ok := ln.(*net.TCPListener)
		if !ok {
			ln.Close()
			errs = append(errs, fmt.Sprintf("fd %d (%q): not a TCP listening socket", fd, name))
			continue
		}
		out = append(out, Socket{Name: name, Listener: tl})
	}
	if len(errs) > 0 {
		for _, s := range out {
			s.Listener.Close()
		}
		return nil, fmt.Errorf("socket activation: %s", strings.Join(errs, "; "))
	}
	return out, nil
}
