package systemd

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// FDStoreMax returns how many descriptors the service manager keeps for
// this service (FileDescriptorStoreMax=, which systemd ≥ 254 exports as
// $FDSTORE; on older systemd the unit sets the variable itself), or 0 when
// it keeps none and FDSTORE=1 messages would be refused.
func (n *Notifier) FDStoreMax() int {
	k, err := strconv.Atoi(n.getenv("FDSTORE"))
	if err != nil || k < 0 {
		return 0
	}
	return k
}

// Store sends f to the service manager's file descriptor store under name
// (FDSTORE=1, FDNAME=): systemd keeps a duplicate and passes it back in
// LISTEN_FDS/LISTEN_FDNAMES on the next start, a `systemctl restart`
// included, so a listening socket stays bound and queues connections
// while no process runs. f should come from listener.Dup: Fd on a File
// from TCPListener.File would clear O_NONBLOCK on the live socket. The
// results are Notify's.
func (n *Notifier) Store(name string, f *os.File) (bool, error) {
	return n.send("FDSTORE=1\nFDNAME="+name, unix.UnixRights(int(f.Fd())))
}

// Unstore removes from the store the descriptors stored under name
// (FDSTOREREMOVE=1), closing systemd's duplicates.
func (n *Notifier) Unstore(name string) (bool, error) {
	return n.send("FDSTOREREMOVE=1\nFDNAME="+name, nil)
}

// send sends state, and the descriptors in oob (unix.UnixRights), in one
// datagram to $NOTIFY_SOCKET. The results are Notify's.
func (n *Notifier) send(state string, oob []byte) (bool, error) {
	path := n.getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|sockCloexec, 0)
	if err != nil {
		return false, fmt.Errorf("sd_notify: %w", err)
	}
	defer unix.Close(fd)
	// SockaddrUnix takes a leading '@' as an abstract socket's, as systemd writes it.
	if err := unix.Sendmsg(fd, []byte(state), oob, &unix.SockaddrUnix{Name: path}, 0); err != nil {
		return false, fmt.Errorf("sd_notify: %w", err)
	}
	return true, nil
}
