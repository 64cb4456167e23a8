// Package torture holds fulcrum's torture harness (issue 24): in one test
// process it runs the real listener.Server and reload.Manager from a
// configuration file, as main does, in front of backends of its own, and
// drives seeded connections with random lifecycles through them while
// backends are cut, killed, drained and reloaded away and the listening
// sockets are handed over to a second Server. Every byte of every stream
// is tagged with its connection's id and checked at both ends. It has no
// code but its tests; see torture_test.go for what it checks and how to
// reproduce a run from its seed.
package torture
