//go:build !linux

package systemd

// sockCloexec: systemd is Linux's, and fulcrum builds only for Linux
// (internal/sockfd says so); this lets `GOOS=darwin go vet ./...` stop
// there with one line instead of here as well.
const sockCloexec = 0
