// Package e2e holds fulcrum's daemon-level tests: they build the binary
// once (TestMain) and run it as a child process against a temporary
// configuration, loopback backends, real server programs (PostgreSQL,
// keepalived, BIRD, systemd's tools) and network-namespace labs. It has no
// code of its own; everything is in its _test.go files.
//
// The network-namespace labs need root and iproute2; they skip under
// -short, and where what they need is missing, except in CI (CI=true),
// where they must run.
package e2e
