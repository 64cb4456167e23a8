//go:build !linux

package sockfd

// fulcrum runs on Linux only: its data path is epoll, splice and accept4
// (sockfd_linux.go). Building it for another system stops here, with this
// one error, rather than at every Linux call of listener/.
var _ = fulcrum_runs_on_Linux_only
