// Package systemd talks to the service manager: sd_notify readiness,
// reload and stop notifications, the watchdog, and socket activation
// (LISTEN_FDS), and the process side of a binary upgrade (Upgrade: start
// the new binary with the listening sockets, wait for it on a pipe, then
// MAINPID=), written directly on golang.org/x/sys/unix. The unit files
// that run fulcrum under systemd live beside it.
//
// It imports nothing of fulcrum's. main wires it in: a Notifier goes to
// the handover package, which passes reload's notifications through
// (READY=1, RELOADING=1, STOPPING=1, STATUS=, WATCHDOG=1), takes the
// sockets passed at start (Listeners) for the listener.Server, and runs
// Upgrade. Outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS) each call
// does nothing and the daemon runs the same.
package systemd
