// Package systemd talks to the service manager: sd_notify readiness,
// reload and stop notifications, the watchdog, and socket activation
// (LISTEN_FDS), and the process side of a binary upgrade (Upgrade: start
// the new binary with the listening sockets, wait for it on a pipe, then
// MAINPID=), written directly on golang.org/x/sys/unix. The unit files
// that run fulcrum under systemd live beside it.
//
// The core daemon runs without it; the systemd integration lands with the
// operations work.
package systemd
