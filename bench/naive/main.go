// Command naive is the benchmark's reference point for "a Go proxy written
// the obvious way": accept, dial the next backend round robin, two io.Copy
// goroutines (which splice through a pipe per direction), half-close on EOF.
// It is deliberately not tuned; fulcrum must beat it.
//
//	naive LISTEN=BACKEND[,BACKEND…] [LISTEN=BACKEND…]
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	var l syscall.Rlimit // hold as many connections as the hard limit allows
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: naive LISTEN=BACKEND[,BACKEND…] …")
		os.Exit(2)
	}
	for _, route := range os.Args[1:] {
		listen, backends, ok := strings.Cut(route, "=")
		ln, err := net.Listen("tcp", listen)
		if !ok || err != nil {
			fmt.Fprintf(os.Stderr, "naive: %q: %v\n", route, err)
			os.Exit(1)
		}
		go serve(ln, strings.Split(backends, ",")) // runs until the process is killed
	}
	select {}
}

func serve(ln net.Listener, backends []string) {
	var next atomic.Uint64
	for {
		c, err := ln.Accept()
		if err != nil {
			time.Sleep(10 * time.Millisecond) // EMFILE and friends: wait, try again
			continue
		}
		go func() { // exits when both directions are done
			defer c.Close()
			b, err := net.Dial("tcp", backends[next.Add(1)%uint64(len(backends))])
			if err != nil {
				return
			}
			defer b.Close()
			done := make(chan struct{})
			go func() { io.Copy(b, c); b.(*net.TCPConn).CloseWrite(); close(done) }() // exits at client EOF or error
			io.Copy(c, b)
			c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}
